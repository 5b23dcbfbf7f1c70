"""Loading a policy does not import the libraries transformers would load for features this package
never uses (models/hf_imports.py), and those libraries stay importable. Each check runs in a fresh
interpreter: the test process has long imported transformers."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from entropyrl.models.hf_imports import UNUSED_BACKENDS

# the libraries that importing those would bring in (sklearn.metrics brings pandas)
LIBRARIES = ("sklearn", "scipy", "pandas")
INSTALLED = [name for name in LIBRARIES if importlib.util.find_spec(name) is not None]


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


LOAD_TINY = """
import json, sys
from entropyrl.conf import compose
from entropyrl.models.loading import load_policy
cfg = compose("train", ["data=toy"])
model, tok = load_policy(cfg.model, cfg.data, log=lambda *_: None)
loaded = [m for m in {libraries!r} if m in sys.modules]
{after}
print(json.dumps({{"loaded": loaded, **extra}}))
"""


@pytest.mark.skipif(not INSTALLED, reason="none of sklearn, SciPy, pandas is installed: nothing to keep out")
def test_loading_a_policy_imports_none_of_the_unused_libraries():
    after = "import sklearn.metrics, scipy.optimize\nextra = {'importable_after': 'sklearn.metrics' in sys.modules}"
    if "sklearn" not in INSTALLED or "scipy" not in INSTALLED:
        after = "extra = {'importable_after': True}"
    out = _run(LOAD_TINY.format(libraries=LIBRARIES, after=after))
    assert out["loaded"] == []
    assert out["importable_after"]


def test_the_probes_are_transformers_own_names():
    """Every probe replaced is a name transformers has: a renamed probe would make the skip a silent no-op."""
    import transformers.utils as hf_utils

    assert set(UNUSED_BACKENDS.values()) == {"sklearn", "scipy"}
    for probe in UNUSED_BACKENDS:
        assert callable(getattr(hf_utils, probe, None)), probe


def test_the_skip_is_a_no_op_once_it_is_too_late_or_the_library_is_loaded():
    code = """
import json, sys
import scipy
from entropyrl.models.hf_imports import skip_unused_backends
first = skip_unused_backends()                 # SciPy already imported: only sklearn's probe changes
import transformers.modeling_utils
late = skip_unused_backends()                  # transformers' model code is loaded: nothing to do
import transformers.utils as hf_utils
probes = {"scipy": hf_utils.is_scipy_available(), "sklearn": hf_utils.is_sklearn_available()}
print(json.dumps({"first": first, "late": late, "probes": probes}))
"""
    if "sklearn" not in INSTALLED or "scipy" not in INSTALLED:
        pytest.skip("sklearn or SciPy is not installed")
    out = _run(code)
    assert [name for name in out["first"] if name != "triton"] == ["sklearn"]  # triton: without a GPU, if installed
    assert out["late"] == []
    assert out["probes"] == {"scipy": True, "sklearn": False}


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed: nothing to keep out")
def test_loading_a_policy_without_a_gpu_imports_no_triton_and_it_stays_importable():
    """torch's dynamo (which transformers' model code imports) imports triton whenever it is installed;
    without a GPU no torch kernel of ours is triton's, so loading a policy leaves it out, and a library
    that wants it (vLLM) still imports it."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: triton's kernels may be used, it is imported as usual")
    after = "import torch._dynamo.utils\nimport triton\nextra = {'importable_after': bool(triton.__version__)}"
    out = _run(LOAD_TINY.format(libraries=("triton",), after=after))
    assert out["loaded"] == []
    assert out["importable_after"]


def test_the_triton_probe_is_torch_own_name():
    """The probe replaced is the name torch's dynamo reads: a rename would make the skip a silent no-op."""
    import torch._dynamo.utils as dynamo_utils
    import torch.utils._triton as probes

    assert callable(probes.has_triton_package)
    assert "has_triton_package" in vars(dynamo_utils)
