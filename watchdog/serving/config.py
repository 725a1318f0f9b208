"""``[auth]``: the bearer token that guards the REST API's mutating calls."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpu_triage.model.config_checks import boolean, optional_path
from gpu_triage.model.config_schema import setting


@dataclass(frozen=True, slots=True)
class AuthConfig:
    token_file: Path | None = setting(None, parse=optional_path, doc="bearer token for mutating endpoints")
    token_file_optional: bool = setting(
        False,
        parse=boolean,
        doc="a missing token_file is no error: mutating calls answer 403 (logged) until it appears",
    )


__all__ = ["AuthConfig"]
