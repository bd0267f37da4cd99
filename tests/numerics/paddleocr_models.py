"""The trained PaddleOCR models the rapidocr wheels ship (a test dependency: ``pip install -e '.[test]'``
or ``make install``; only their ``models/*.onnx`` files are used)."""

import importlib.util
import os

# key: (package, file); the five distinct models of rapidocr 3.10.0 and rapidocr-onnxruntime 1.4.4
MODELS = {
    "cls": ("rapidocr", "ch_ppocr_mobile_v2.0_cls_mobile.onnx"),
    "v4-det": ("rapidocr_onnxruntime", "ch_PP-OCRv4_det_infer.onnx"),
    "v4-rec": ("rapidocr_onnxruntime", "ch_PP-OCRv4_rec_infer.onnx"),
    "v6-det": ("rapidocr", "PP-OCRv6_det_small.onnx"),
    "v6-rec": ("rapidocr", "PP-OCRv6_rec_small.onnx"),
}


def model_path(key: str) -> str:
    """The installed model file (found through the package's folder, without importing the package:
    rapidocr's own imports need opencv, which the test set-up does not install)."""
    package, name = MODELS[key]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{package} is not installed: run `make install` (the test extra installs it)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "models", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing from the installed {package} wheel")
    return path
