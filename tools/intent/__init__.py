"""The intent classifier's offline tool chain: data generation, training, evaluation.

The classifier itself (apps.gateway.intent) reads only the artifact this writes. Here: the
phrasing and slot tables (TOML, read by tables.py), the generator that turns them into
data/train.jsonl and data/heldout.jsonl (generate.py), the hand-written data/natural.jsonl,
training (train.py) and scoring (evaluate.py), which `python -m tools.intent train` and `report`
run (__main__.py, no Django needed). A repository checkout only: tools/ is not in the wheel.
"""
