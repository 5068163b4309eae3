"""UTF-8 text → token ids, attention mask and token type ids from a `tokenizer.json`.

Every row is padded (and, if allowed, truncated) to the same `maxLength`, so rows of different
requests always share a shape and can share a batch. The tokenizer is the Hugging Face
`tokenizers` library reading the model's own tokenizer file; nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from batchpilot.api.pipeline import TextPreprocess
from batchpilot.runtime.errors import InvalidRequest, RequestTooLarge


class TokenizerLoadError(ValueError):
    """The tokenizer file is missing, unreadable or unusable with this config."""


def load_tokenizer(path: Path, config: TextPreprocess) -> Tokenizer:
    """The tokenizer, set to truncate and pad every row to exactly `maxLength` tokens."""
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for a missing or bad file
        raise TokenizerLoadError(f"tokenizer {path} cannot be loaded: {exc}") from None
    padding = tokenizer.padding
    if padding is not None:
        pad_id, pad_token = padding["pad_id"], padding["pad_token"]
    else:
        pad_token = config.pad_token
        found = tokenizer.token_to_id(pad_token)
        if found is None:
            raise TokenizerLoadError(
                f"tokenizer {path} defines no padding and has no token {pad_token!r}; "
                "set padToken to its padding token"
            )
        pad_id = found
    # Rows longer than maxLength are cut (and refused later when truncate is false).
    tokenizer.enable_truncation(max_length=config.max_length)
    tokenizer.enable_padding(length=config.max_length, pad_id=pad_id, pad_token=pad_token)
    return tokenizer


@dataclass(frozen=True, slots=True)
class TextStage:
    config: TextPreprocess
    tokenizer: Tokenizer
    dtypes: dict[str, np.dtype[Any]]
    """Model input name → its integer dtype, for the inputs this stage fills."""

    def __call__(self, elements: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
        texts = [self._text(element, row) for row, element in enumerate(elements)]
        encodings = self.tokenizer.encode_batch(texts)
        if not self.config.truncate:
            for row, encoding in enumerate(encodings):
                if encoding.overflowing:
                    raise InvalidRequest(
                        f"text row {row} is longer than {self.config.max_length} tokens"
                    )
        config = self.config
        out = {config.input_ids: [e.ids for e in encodings]}
        if config.attention_mask is not None:
            out[config.attention_mask] = [e.attention_mask for e in encodings]
        if config.token_type_ids is not None:
            out[config.token_type_ids] = [e.type_ids for e in encodings]
        return {name: np.asarray(rows, dtype=self.dtypes[name]) for name, rows in out.items()}

    def _text(self, element: Any, row: int) -> str:
        if not isinstance(element, bytes):
            raise InvalidRequest(f"text row {row} must be bytes, got {type(element).__name__}")
        if len(element) > self.config.max_bytes:
            raise RequestTooLarge(
                f"text row {row} is {len(element)} bytes; the limit is {self.config.max_bytes}"
            )
        try:
            text = element.decode()
        except UnicodeDecodeError as exc:
            raise InvalidRequest(f"text row {row} is not UTF-8 text: {exc}") from None
        if not text.strip():
            raise InvalidRequest(f"text row {row} is empty")
        return text
