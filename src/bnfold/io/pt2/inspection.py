"""The inspection of a whole archive: ``check_pt2_bytes`` / ``inspect_pt2_bytes`` and what they found."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import ModelFileError, UnsafeModelError
from ..limits import Limits, loads_json
from .archive import Archive
from .layout import layout
from .payloads import check_records
from .pickles import check_torch_save_payload
from .program import check_program_json


@dataclass
class Pt2Inspection:
    """What the inspection found.  ``unsafe`` lists one line per risky entry."""

    models: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)

    @property
    def safe(self) -> bool:
        return not self.unsafe


TRUST_HINT = "pass --trust only if you trust whoever made this file"


def check_pt2_bytes(data: bytes, source: str, limits: Limits | None = None) -> Pt2Inspection:
    """Raise ``ModelFileError`` for a malformed archive, ``UnsafeModelError`` for a risky one."""
    result = inspect_pt2_bytes(data, source, limits)
    if result.unsafe:
        more = f" (and {len(result.unsafe) - 1} more)" if len(result.unsafe) > 1 else ""
        err = UnsafeModelError(
            f"{source}: refusing to load: {result.unsafe[0]}{more}; "
            f"loading it could run code from the file; {TRUST_HINT}"
        )
        err.findings = list(result.unsafe)  # type: ignore[attr-defined]
        raise err
    return result


def inspect_pt2_bytes(data: bytes, source: str, limits: Limits | None = None) -> Pt2Inspection:
    """Inspect an archive's bytes; raises ``ModelFileError`` if it is not a loadable pt2 archive."""
    L = layout()
    result = Pt2Inspection()
    records = Archive(data, source, result, limits)
    if result.unsafe:  # the zip readers disagree: nothing more is read (torch's reader may read other bytes)
        return result

    fmt = records.get_small(L["ARCHIVE_FORMAT_PATH"])
    if fmt is None or fmt.strip() != L["ARCHIVE_FORMAT_VALUE"].encode():
        raise ModelFileError(f"{source}: {records.describe_foreign()}")
    version = records.get_small(L["ARCHIVE_VERSION_PATH"])
    if version is None or version.decode("utf-8", "replace") != L["ARCHIVE_VERSION_VALUE"]:
        shown = "missing" if version is None else repr(version.decode("utf-8", "replace")[:20])
        raise ModelFileError(
            f"{source}: pt2 archive version {shown} is not supported by this torch "
            f"(expects {L['ARCHIVE_VERSION_VALUE']!r})"
        )
    records.check_json_values()  # before any JSON entry is parsed, here or by torch.export.load

    for name in records.names:
        if name.startswith(L["AOTINDUCTOR_DIR"]):
            result.unsafe.append(
                f"{name} is AOTInductor compiled code, which torch.export.load loads as a native library"
            )
            break

    models_dir = L["MODELS_DIR"]
    model_files = [n for n in records.names if n.startswith(models_dir)]
    if not model_files:
        raise ModelFileError(f"{source}: the archive holds no exported program (no {models_dir}*.json entry)")
    for entry in model_files:
        if not entry.endswith(".json"):
            raise ModelFileError(f"{source}: unexpected entry {entry} in {models_dir}")
        model = entry[len(models_dir) : -len(".json")]
        result.models.append(model)
        _check_model(records, model, entry, L, result)
    if "model" not in result.models:
        raise ModelFileError(f"{source}: the archive holds no program named 'model' (found {', '.join(result.models)})")
    return result


def _check_model(records: Archive, model: str, entry: str, L: dict[str, str], result: Pt2Inspection) -> None:
    src = records.source
    doc = loads_json(records.need(entry), f"{src}: {entry}", records.limits)
    if not isinstance(doc, dict):
        raise ModelFileError(f"{src}: {entry} is not a serialized exported program")
    result.unsafe.extend(check_program_json(doc, entry, records.limits))

    sample = L["SAMPLE_INPUTS_FILENAME_FORMAT"].format(model)
    result.unsafe.extend(check_torch_save_payload(records.need(sample), sample))
    configs: dict[str, dict[str, Any]] = {}  # each payload config parsed once
    for kind in ("WEIGHTS", "CONSTANTS"):
        cfg_name = L[f"{kind}_CONFIG_FILENAME_FORMAT"].format(model)
        if records.has(cfg_name):
            check_records(records, _payload_config(records, cfg_name, configs), L[f"{kind}_DIR"], cfg_name)

    legacy_weights = f"{L['WEIGHTS_DIR']}{model}.pt"
    if records.has(legacy_weights):
        result.unsafe.extend(check_torch_save_payload(records.need(legacy_weights), legacy_weights))
    else:
        cfg_name = L["WEIGHTS_CONFIG_FILENAME_FORMAT"].format(model)
        for fqn, meta in _payload_config(records, cfg_name, configs).items():
            if meta.get("use_pickle", False):
                path = L["WEIGHTS_DIR"] + str(meta.get("path_name", "?"))
                result.unsafe.append(f"weight {fqn} ({path}) is pickled and would be loaded with weights_only=False")

    legacy_constants = f"{L['CONSTANTS_DIR']}{model}.pt"
    if records.has(legacy_constants):
        result.unsafe.extend(check_torch_save_payload(records.need(legacy_constants), legacy_constants))
    else:
        cfg_name = L["CONSTANTS_CONFIG_FILENAME_FORMAT"].format(model)
        for fqn, meta in _payload_config(records, cfg_name, configs).items():
            path_name = meta.get("path_name")
            if not isinstance(path_name, str):
                raise ModelFileError(f"{src}: {cfg_name}: constant {fqn} has no path_name")
            path = L["CONSTANTS_DIR"] + path_name
            if path_name.startswith(L["TENSOR_CONSTANT_FILENAME_PREFIX"]):
                if meta.get("use_pickle", False):
                    result.unsafe.append(
                        f"constant {fqn} ({path}) is pickled and would be loaded with weights_only=False"
                    )
            elif path_name.startswith(L["CUSTOM_OBJ_FILENAME_PREFIX"]):
                result.unsafe.append(f"constant {fqn} ({path}) is a TorchScript object that would be unpickled")
            elif path_name.startswith(L["OPAQUE_OBJ_FILENAME_PREFIX"]):
                result.unsafe.append(f"constant {fqn} ({path}) is an opaque object loaded with pickle.loads")
            else:
                raise ModelFileError(f"{src}: {cfg_name}: constant {fqn} has an unknown kind ({path_name})")


def _payload_config(records: Archive, name: str, parsed: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The ``config`` of payload config ``name``, parsed once (kept in ``parsed``)."""
    if name in parsed:
        return parsed[name]
    doc = loads_json(records.need(name), f"{records.source}: {name}", records.limits)
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(config, dict) or not all(isinstance(v, dict) for v in config.values()):
        raise ModelFileError(f"{records.source}: {name} is not a payload config")
    parsed[name] = config
    return config
