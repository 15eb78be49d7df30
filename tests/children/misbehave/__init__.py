"""A stand-in framework child that fails on purpose (`python -m tests.children.misbehave`: __main__.py says how)."""

# The file a test writes beside its run to say how the stand-in misbehaves (__main__.py)
SPEC = "misbehave.json"
