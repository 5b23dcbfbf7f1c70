"""What importing a Hugging Face model class costs, cut to what this package uses.

transformers imports some optional libraries as soon as any model class loads, whenever they are
installed, for features this package never uses:

- scikit-learn (MLflow requires it, so a full install has it): ``generation/candidate_generator.py``
  imports ``sklearn.metrics``, and with it pandas and pyarrow, for the adaptive confidence threshold
  of assisted decoding (``assistant_model=`` with ``assistant_confidence_threshold``); this
  package's engines sample from the policy alone (``rollout/``);
- SciPy: the object-detection losses (``loss/loss_for_object_detection.py`` and its siblings, loaded
  by ``modeling_utils``) import ``scipy.optimize`` for their box matching; the policies here are
  causal language models.

- triton (vLLM's CPU build brings it): torch's dynamo, which transformers' model code imports,
  imports the triton package whenever it is installed (``torch.utils._triton.has_triton_package``),
  about 70 MB, though without a GPU nothing of torch's runs a triton kernel.

Together they are seconds of start-up and well over a hundred MB of resident memory in every process
that loads a policy. ``skip_unused_backends`` makes transformers' probes for them answer "absent"
before those modules load, so the imports never happen, and on a machine without a GPU torch's probe
for triton answers "absent" before dynamo loads (``skip_triton_without_gpu``). The libraries stay
importable for anything else that asks for them (MLflow, a user's reward function, vLLM): only the
probes change.
"""

from __future__ import annotations

import functools
import importlib.util
import sys

# transformers' probe (a name in ``transformers.utils``) -> the library it looks for
UNUSED_BACKENDS = {"is_sklearn_available": "sklearn", "is_scipy_available": "scipy"}
# the first transformers module that reads those probes at import (modeling_utils loads the losses,
# the generation mixin the candidate generator): once it is loaded, the probes were read
_READ_BY = ("transformers.modeling_utils", "transformers.generation.candidate_generator")


def _absent() -> bool:
    return False


def skip_unused_backends() -> list[str]:
    """Before a transformers model class is first imported: transformers' probes for the libraries of
    ``UNUSED_BACKENDS`` answer "absent", so loading a model does not import them, nor triton without a
    GPU (``skip_triton_without_gpu``). Returns the libraries
    whose probe was replaced: none when it is too late (transformers' model code is loaded), when
    transformers is not installed, or for a library already imported (nothing to save). Idempotent."""
    skipped = ["triton"] if skip_triton_without_gpu() else []
    if any(name in sys.modules for name in _READ_BY):
        return skipped
    try:
        import transformers.utils as hf_utils
    except ImportError:  # no transformers: nothing will import them
        return skipped
    for probe, library in UNUSED_BACKENDS.items():
        if library in sys.modules or not callable(getattr(hf_utils, probe, None)):
            continue
        setattr(hf_utils, probe, _absent)  # read by name when those modules load
        skipped.append(library)
    return skipped


@functools.cache
def _no_triton() -> bool:
    return False


def skip_triton_without_gpu() -> bool:
    """Before torch's dynamo is first imported, on a machine where torch sees no GPU (CUDA or XPU):
    torch's probe for the triton package answers "absent", so dynamo does not import it. True when
    the probe was replaced; False when dynamo or triton is loaded already (too late, or nothing to
    save), when triton is not installed, or when torch sees a GPU (its kernels may be triton's)."""
    if "torch._dynamo" in sys.modules or "triton" in sys.modules:
        return False
    import torch
    import torch.utils._triton as probes

    xpu = getattr(torch, "xpu", None)
    if torch.cuda.is_available() or (xpu is not None and xpu.is_available()):
        return False
    if probes.__dict__.get("has_triton_package") is _no_triton:  # replaced by an earlier call
        return False
    if importlib.util.find_spec("triton") is None or not callable(getattr(probes, "has_triton_package", None)):
        return False
    probes.has_triton_package = _no_triton  # read by name when torch._dynamo.utils loads
    return True
