"""Where things live in a ``torch.export.save`` archive (torch 2.13's pt2 layout)."""

from __future__ import annotations

ZIP_MAGIC = b"PK\x03\x04"

# torch/export/pt2_archive/constants.py (torch 2.13); read from torch at run time
# when available so that a renamed layout is noticed rather than silently missed.
_LAYOUT_DEFAULTS = {
    "AOTINDUCTOR_DIR": "data/aotinductor/",
    "ARCHIVE_FORMAT_PATH": "archive_format",
    "ARCHIVE_FORMAT_VALUE": "pt2",
    "ARCHIVE_VERSION_PATH": "archive_version",
    "ARCHIVE_VERSION_VALUE": "0",
    "CONSTANTS_CONFIG_FILENAME_FORMAT": "data/constants/{}_constants_config.json",
    "CONSTANTS_DIR": "data/constants/",
    "CUSTOM_OBJ_FILENAME_PREFIX": "custom_obj_",
    "EXTRA_DIR": "extra/",
    "MODELS_DIR": "models/",
    "MODELS_FILENAME_FORMAT": "models/{}.json",
    "OPAQUE_OBJ_FILENAME_PREFIX": "opaque_obj_",
    "SAMPLE_INPUTS_FILENAME_FORMAT": "data/sample_inputs/{}.pt",
    "TENSOR_CONSTANT_FILENAME_PREFIX": "tensor_",
    "WEIGHTS_CONFIG_FILENAME_FORMAT": "data/weights/{}_weights_config.json",
    "WEIGHTS_DIR": "data/weights/",
}


def layout() -> dict[str, str]:
    try:
        from torch.export.pt2_archive import constants as c
    except Exception:  # noqa: BLE001  # pragma: no cover - older or newer torch without the module
        return dict(_LAYOUT_DEFAULTS)
    return {k: getattr(c, k, v) for k, v in _LAYOUT_DEFAULTS.items()}
