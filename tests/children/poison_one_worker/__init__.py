"""A real framework child whose data overflows float16 on one worker only (`python -m tests.children.poison_one_worker`:
__main__.py says how)."""
