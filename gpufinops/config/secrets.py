"""Secrets: never in the file. A `SecretRef` names the environment variable or the mounted file that holds one;
a set but blank (or unreadable, or too long) secret is refused at load naming its key (`blank_secrets`); a secret
file is read bounded (MAX_SECRET_BYTES).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field

from .loading import ConfigError, compose_yaml, line_of
from .values import StrictModel

class SecretRef(StrictModel):
    """Where a secret lives: an environment variable or a mounted file.

    Unset (no such variable, no such file) is "not configured": an optional secret's feature is off. Set but blank
    (a variable holding only whitespace, a mounted file holding only a newline, as an empty Kubernetes Secret key
    mounts) is never a secret: `load_settings` refuses it naming the key (`blank_secrets`), and `resolve()` hands
    back "" for it, which no bearer check accepts (httpd.authorize)."""

    env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None  # a variable's name
    file: Annotated[str, Field(min_length=1)] | None = None

    def resolve(self) -> str | None:
        """The secret, stripped; None when not configured; "" when set but blank or unreadable."""
        if self.env and (value := os.environ.get(self.env)) is not None:
            return value.strip()
        if self.file and Path(self.file).is_file():
            try:
                return _secret_file_text(self.file).strip()
            except (OSError, ValueError):  # unreadable, not text, too long: never a secret, never an open door
                return ""
        return None

    def blank(self) -> str | None:
        """Why this secret is set but unusable (blank, unreadable), or None when it is usable or not configured."""
        if self.env and (value := os.environ.get(self.env)) is not None and not value.strip():
            return f"the environment variable {self.env} is set but blank: give the secret, or unset it"
        if self.file and Path(self.file).is_file():
            try:
                if not _secret_file_text(self.file).strip():
                    return f"the file {self.file} is blank: give the secret, or remove file:"
            except (OSError, ValueError) as exc:
                return f"the file {self.file} cannot be read: {getattr(exc, 'strerror', None) or exc}"
        return None


def env_secret(name: str):
    """A field whose default is the secret in the environment variable `name`. A factory, not a `SecretRef` made
    when the section's class is defined: making one would build the models' validators at import, which every
    command pays for in start-up time (the models are built when first used: StrictModel's defer_build); and the
    default is set without SecretRef's validator (values.defaults_of: `name` is one of ours, a valid name)."""
    return Field(default_factory=lambda: SecretRef.model_construct(env=name))


MAX_SECRET_BYTES = 64 * 1024  # a token, a password, a key: far less; more is the wrong file, never read whole


def _secret_file_text(path: str) -> str:
    """A secret file's text (UTF-8); ValueError when it is longer than MAX_SECRET_BYTES or not UTF-8."""
    with open(path, "rb") as f:
        data = f.read(MAX_SECRET_BYTES + 1)
    if len(data) > MAX_SECRET_BYTES:
        raise ValueError(f"longer than {MAX_SECRET_BYTES // 1024} KiB: not a secret")
    return data.decode("utf-8")


def secret_refs(model: BaseModel, loc: tuple = ()) -> list[tuple[tuple, SecretRef]]:
    """Every SecretRef of a settings tree with its dotted location, sections nested at any depth."""
    if isinstance(model, SecretRef):
        return [(loc, model)]
    out: list[tuple[tuple, SecretRef]] = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out.extend(secret_refs(value, (*loc, name)))
        elif isinstance(value, tuple):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    out.extend(secret_refs(item, (*loc, name, i)))
    return out


def blank_secrets(settings: BaseModel, where: str, text: str) -> None:
    """A ConfigError naming each secret of `settings` that is set but blank or unreadable (file, line, key)."""
    root = None  # the document's node tree, composed for the first error's line only
    errors = []
    for loc, ref in secret_refs(settings):
        why = ref.blank()
        if why is not None:
            root = root or (compose_yaml(text) if text else None)
            line = line_of(where, loc, text, root) if root is not None else None
            key = ".".join(str(p) for p in loc)
            errors.append(f"{where}:{line}: key '{key}': {why}" if line else f"{where}: key '{key}': {why}")
    if errors:
        raise ConfigError("\n".join(errors))
