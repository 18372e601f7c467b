package e2b

import (
	"encoding/hex"
	"strings"

	"github.com/evalbox/evalbox/internal/catalog"
	"github.com/evalbox/evalbox/internal/store"
)

// E2B names builds by UUID, evalbox by "bld_" and 80 random bits. The E2B
// form of an evalbox build id is a UUID of version 8 (RFC 9562: custom)
// that carries those bits, so that each converts to the other without a
// table, also after a restart:
//
//	bytes 0–5: bits 0–47 · byte 6: 0x80 (version 8) · byte 7: bits 48–55 ·
//	byte 8: 0x80 (variant 10) · byte 9: bits 56–63 · bytes 10–11: bits 64–79 ·
//	bytes 12–15: 0
//
// Harbor and the SDKs parse the build ID as a UUID; a bld_ id would not.

// e2bBuildID is the E2B form of an evalbox build id ("" for an id that is
// not one).
func e2bBuildID(id string) string {
	b, ok := store.IDBytes("bld", id)
	if !ok {
		return ""
	}
	var u [16]byte
	copy(u[0:6], b[0:6])
	u[6], u[7], u[8], u[9] = 0x80, b[6], 0x80, b[7]
	copy(u[10:12], b[8:10])
	h := hex.EncodeToString(u[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// evalboxBuildID undoes e2bBuildID; ok is false for a UUID it did not make.
func evalboxBuildID(uuid string) (string, bool) {
	raw, err := hex.DecodeString(strings.ReplaceAll(strings.ToLower(uuid), "-", ""))
	if err != nil || len(raw) != 16 || len(uuid) != 36 || raw[6] != 0x80 || raw[8] != 0x80 ||
		raw[12]|raw[13]|raw[14]|raw[15] != 0 {
		return "", false
	}
	var b [10]byte
	copy(b[0:6], raw[0:6])
	b[6], b[7] = raw[7], raw[9]
	copy(b[8:10], raw[10:12])
	return store.IDFromBytes("bld", b), true
}

// newBuild returns a new build's evalbox id and its E2B form.
func newBuild() (id, uuid string) {
	id = catalog.NewBuildID()
	return id, e2bBuildID(id)
}
