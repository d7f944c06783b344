"""What the tests share: helpers and data builders (fixtures live in tests/conftest.py). Imported
one way everywhere, `from tests.helpers import ...` / `from tests.helpers.<module> import ...`
(the repository root is on sys.path for the tests and for the children they start); no test
module imports another."""
