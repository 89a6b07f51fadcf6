"""Intent classification, layer 1 of the gateway: which kind of task a prompt asks for.

The only module other code imports: `classify(text)` returns a Prediction (`.label`, one of
LABELS, and `.confidence`, the model's probability for it); `load()` reads the model ahead of
the first request; `user_request(messages)` is what it reads of a chat: the last user turn (the
app's system prompt and the assistant's turns do not decide), after the earlier user turn it
refers back to when it only does that ("do the same for this", "继续"); `last_user_turn` is
that last turn alone. What of that text the model reads
(the instruction, not the material pasted with it) is reading.py's. Its offline tool chain
(data, generation, training, evaluation) is tools/intent, in a repository checkout only; it
writes artifacts/intent.npz, the one file read here.
"""

from apps.gateway.intent.classifier import classify, load
from apps.gateway.intent.labels import LABELS, Intent
from apps.gateway.intent.model import ArtifactError, Prediction
from apps.gateway.intent.reading import last_user_turn, user_request

__all__ = [
    "LABELS",
    "ArtifactError",
    "Intent",
    "Prediction",
    "classify",
    "last_user_turn",
    "load",
    "user_request",
]
