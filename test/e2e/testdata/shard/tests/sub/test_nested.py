from helper import value

class TestNested:
    def test_value(self):
        assert value() == 42
