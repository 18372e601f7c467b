def test_ok():
    assert True

def test_bad():
    assert 1 == 2, "one is not two"
