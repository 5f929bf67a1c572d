"""Check the workflow config against its schema and say what is wrong in a few lines.

Snakemake's `validate()` puts the whole schema (~900 lines) into its error, which buries the one line that
matters. `check_config` runs the same JSON-schema check (jsonschema, the library Snakemake uses, with
defaults filled in the same way, on a copy) and returns one line per error: the failing key path, the
schema's message and, for an unknown key or value, the closest valid name. Every error, with its schema
path, goes to a file whose path the message names. workflows/rules/common.smk calls it first, then
`fill_defaults` on the real config. Snakemake's own `validate()` is not used: its default filling calls
`setdefault` on whatever a block holds, which fails with an AttributeError on a block the config may set to
null (`nightly.plan_optimality`); here a null block stays null and the rules leave its part out.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

MAX_LINES = 3  # errors shown in the short message; the file has all of them
HEADER = "Error validating config file"  # Snakemake's wording, which users (and tests) look for


def _fill_defaults(validator_class: type) -> type:
    """The validator class, extended to set each property's schema default before checking it (what
    Snakemake's validate(set_default=True) does): an error that only shows once defaults are in, such as
    a default that fails a pattern, is then found here too, and the two checks agree."""
    check_properties = validator_class.VALIDATORS["properties"]

    def properties(validator: Any, props: Mapping, instance: Any, schema: Mapping) -> Iterator[ValidationError]:
        if isinstance(instance, dict):  # a null (optional) block stays null: nothing to fill
            for name, sub in props.items():
                if isinstance(sub, Mapping) and "default" in sub:
                    instance.setdefault(name, copy.deepcopy(sub["default"]))
        yield from check_properties(validator, props, instance, schema)

    return validators.extend(validator_class, {"properties": properties})


def schema_errors(config: Mapping, schema: Mapping) -> list[ValidationError]:
    """Every error of ``config`` under ``schema`` (``config`` itself is not changed)."""
    validator = _fill_defaults(Draft202012Validator)(schema)
    return list(validator.iter_errors(copy.deepcopy(dict(config))))


def fill_defaults(config: dict, schema_file: Path) -> dict:
    """Set every schema default missing from ``config``, in place (a config that passed ``check_config``).
    A block set to null is left null; an empty block gets each of its keys' defaults. Returns ``config``."""
    schema = yaml.safe_load(Path(schema_file).read_text())
    for _ in _fill_defaults(Draft202012Validator)(schema).iter_errors(config):
        pass  # the check already reported errors; iterating is what fills
    return config


def key_path(parts: Iterable[Any]) -> str:
    """``sweeps.cpu_smoke.matrices[0].systems`` from the instance path of an error."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _unknown_keys(error: ValidationError) -> list[str]:
    """The keys an ``additionalProperties: false`` error is about (those neither listed nor matched)."""
    props = error.schema.get("properties", {})
    patterns = error.schema.get("patternProperties", {})
    return [k for k in error.instance if k not in props and not any(re.search(p, k) for p in patterns)]


def _closest(word: Any, names: Iterable[Any]) -> str | None:
    if not isinstance(word, str):
        return None
    hits = difflib.get_close_matches(word, [n for n in names if isinstance(n, str)], n=1)
    return hits[0] if hits else None


def _hint(name: str | None) -> str:
    return f"; did you mean {name!r}?" if name else ""


def _string_hint(error: ValidationError) -> str:
    """For a type error on a string that YAML would read as another type ('null', '2', 'true'): Snakemake's
    --config passes every value nested in a mapping as a string, so such a value needs a --configfile."""
    if error.validator != "type" or not isinstance(error.instance, str):
        return ""
    try:
        parsed = yaml.safe_load(error.instance)
    except yaml.YAMLError:
        return ""
    return "" if isinstance(parsed, str) else "; a nested --config value is always a string: set it in a --configfile"


def short_lines(error: ValidationError) -> list[str]:
    """One line per problem of ``error``: ``path: message[; did you mean 'x'?]``. An unknown-key error gets
    a line per unknown key, with that key in the path and the closest key allowed at that level."""
    where = list(error.absolute_path)
    if error.validator == "additionalProperties" and error.validator_value is False:
        allowed = list(error.schema.get("properties", {}))
        keys = _unknown_keys(error)
        if keys:
            return [f"{key_path([*where, k])}: Additional properties are not allowed ({k!r} was unexpected)"
                    f"{_hint(_closest(k, allowed))}" for k in keys]
    hint = _hint(_closest(error.instance, error.validator_value)) if error.validator == "enum" else _string_hint(error)
    return [f"{key_path(where)}: {error.message}{hint}"]


def full_text(errors: list[ValidationError], schema_file: Path) -> str:
    """All errors, each with its key path, schema path, offending value and (oneOf/anyOf) sub-errors."""
    out = [f"{HEADER} against {schema_file}: {len(errors)} error(s).", ""]
    for i, e in enumerate(errors, 1):
        out += [f"{i}. {line}" for line in short_lines(e)]
        out.append(f"   schema path: #/{'/'.join(map(str, e.schema_path))}")
        if e.validator == "additionalProperties" and e.validator_value is False:
            out.append(f"   allowed keys here: {', '.join(e.schema.get('properties', {})) or '(none)'}")
        value = repr(e.instance)
        out.append(f"   value: {value if len(value) <= 400 else value[:400] + ' ...'}")
        for sub in e.context:  # why each branch of a oneOf / anyOf failed
            out.append(f"   - {key_path(sub.absolute_path)}: {sub.message}")
        out.append("")
    return "\n".join(out)


def short_message(errors: list[ValidationError], full_file: Path) -> str:
    lines = [line for e in errors for line in short_lines(e)]
    if len(lines) == 1:
        return f"{HEADER}: {lines[0]} (full message: {full_file})"
    shown = [f"  {line}" for line in lines[:MAX_LINES]]
    more = [f"  ... and {len(lines) - MAX_LINES} more"] if len(lines) > MAX_LINES else []
    return "\n".join([f"{HEADER}: {len(lines)} errors (full message: {full_file})", *shown, *more])


def check_config(config: Mapping, schema_file: Path, full_file: Path) -> str | None:
    """None when ``config`` passes ``schema_file``; else the short message, after writing the full one
    to ``full_file`` (an earlier run's file is removed when the config passes, so it never misleads)."""
    schema = yaml.safe_load(Path(schema_file).read_text())
    errors = schema_errors(config, schema)
    if not errors:
        Path(full_file).unlink(missing_ok=True)
        return None
    Path(full_file).parent.mkdir(parents=True, exist_ok=True)
    Path(full_file).write_text(full_text(errors, schema_file))
    return short_message(errors, full_file)
