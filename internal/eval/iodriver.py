# evalbox I/O mode driver. It runs the candidate program, calls its entry
# point with each case's arguments and prints one JSON line per case on the
# original stdout: {"case": i, "output": <value>} or {"case": i, "error":
# "<exception>"}. The candidate's own prints go to stderr. The expected
# outputs are not in the sandbox: evalbox compares outside it.
import json as _json
import os as _os
import traceback as _traceback


def _evalbox_io(source, entry_point, cases):
    out = _os.fdopen(_os.dup(1), "w", encoding="utf-8")
    _os.dup2(2, 1)
    scope = {"__name__": "__candidate__"}
    exec(compile(source, "<candidate>", "exec"), scope)
    fn = scope.get(entry_point)
    if not callable(fn):
        raise NameError("name %r is not defined" % entry_point)
    for i, args in enumerate(_json.loads(cases)):
        try:
            line = _json.dumps({"case": i, "output": fn(*args)}, allow_nan=False)
        except BaseException as e:
            line = _json.dumps({"case": i, "error": _traceback.format_exception_only(type(e), e)[-1].strip()})
        out.write(line + "\n")
        out.flush()


