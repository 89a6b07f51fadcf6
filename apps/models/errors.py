from enum import StrEnum


class ModelsErrorCode(StrEnum):
    MODEL_NOT_FOUND = "model_not_found"
    VERSION_NOT_FOUND = "model_version_not_found"
    TOKENIZER_MISMATCH = "tokenizer_hash_mismatch"
