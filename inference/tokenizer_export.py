"""Read a model's tokenizer for the platform, which counts prompt tokens with it."""

from __future__ import annotations

from inference.wire import TokenizerUpload


def export_tokenizer(model: str) -> TokenizerUpload | None:
    """Return the model's fast tokenizer and chat template, or None when it has none."""
    from transformers import AutoTokenizer  # vLLM's own dependency; heavy, so imported here

    tokenizer = AutoTokenizer.from_pretrained(model)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    return TokenizerUpload(
        tokenizer_json=backend.to_str(),
        chat_template=template or "",
        bos_token=tokenizer.bos_token or "",
        eos_token=tokenizer.eos_token or "",
    )
