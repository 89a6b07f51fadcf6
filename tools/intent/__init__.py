"""The intent classifier's offline tool chain: data generation, training, evaluation.

The classifier itself (apps.gateway.intent) reads only the artifact this writes. Here: the
phrasing and slot tables (TOML, read by tables.py), the generator that turns them into
data/train.jsonl and data/heldout.jsonl (generate.py), the hand-written data/natural.jsonl,
training (train.py) and scoring (evaluate.py), which manage.py intent_train and intent_report
run. A repository checkout only: tools/ is not in the wheel.
"""
