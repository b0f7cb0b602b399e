"""Red-team helpers for tests/test_redteam.py: the outside world (canaries) and the attack runner."""
