# Types of the compiled features (_hashing.c), for mypy. The C code takes any C-contiguous
# float32 buffer for the weights and bias; the classifier passes numpy arrays.
import numpy as np
from numpy.typing import NDArray

BUCKET_BITS: int
CHAR_NGRAM_MAX: int
EDGE_CHARS: int

def features(normalised_text: str, /) -> tuple[bytes, bytes]: ...
def logits(
    normalised_text: str, weights: NDArray[np.float32], bias: NDArray[np.float32], /
) -> list[float]: ...
