"""Reading a Hugging Face config.json: required fields and table-mapped choices, with errors by field."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from t5x_lite.hf.errors import ConversionError


def require(config: Mapping[str, Any], fields: Iterable[str], architecture: str) -> None:
    """Every one of `fields` is in config.json, or a ConversionError names the first missing one."""
    for field in fields:
        if field not in config:
            raise ConversionError(f"config.json has no {field!r}, which a {architecture} needs.")


def choice(config: Mapping[str, Any], field: str, default: str, table: Mapping[str, Any]) -> Any:
    """table[config[field]] (config.json's value, or `default`); an unknown value names the field and the choices."""
    value = config.get(field, default)
    if value not in table:
        raise ConversionError(f"config.json {field}={value!r} is not supported; choose one of {sorted(table)}.")
    return table[value]
