import pytest

@pytest.mark.skip(reason="not today")
def test_skipped():
    pass

def test_error_in_fixture(missing_fixture):
    pass
