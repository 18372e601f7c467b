def test_one():
    assert 1 + 1 == 2

def test_two():
    assert "a".upper() == "A"

def test_three():
    assert [1, 2][::-1] == [2, 1]
