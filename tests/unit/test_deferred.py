"""Deferred modules (predictor/deferred.py) behave as the real ones once used. Each test runs in a
child interpreter: the test process has pandas and kubernetes imported already, and a stand-in left
in its sys.modules would leak into every later test."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PRELUDE = "import sys\nfrom predictor import deferred\ninstalled = deferred.defer()\n"


def _run(code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def test_importing_kserve_after_defer_loads_neither_pandas_nor_the_kubernetes_client():
    out = _run(
        """
        import kserve, kserve.protocol.infer_type
        real = [m for m in sys.modules if m.split(".")[0] in ("pandas", "kubernetes")
                and not isinstance(sys.modules[m], deferred.DeferredModule)]
        print(sorted(installed) == ["kubernetes", "pandas"], real == [])
        """
    )

    assert out == ["True", "True"]


def test_kserves_dataframe_helpers_work_on_first_use():
    out = _run(
        """
        import numpy as np
        import pandas as early_binding  # as kserve's modules hold it: the stand-in, for good
        from kserve.protocol.infer_type import InferInput, InferRequest
        from kserve.utils.utils import get_predict_input

        assert not isinstance(object(), early_binding.DataFrame)  # no DataFrame exists yet
        x = InferInput("x", [2], "FP32")
        x.set_data_from_numpy(np.array([1.5, 2.5], dtype=np.float32), binary_data=False)
        frame = InferRequest(model_name="m", infer_inputs=[x]).as_dataframe()
        import pandas
        print(type(frame).__module__.split(".")[0], frame["x"].tolist() == [1.5, 2.5],
              isinstance(frame, early_binding.DataFrame), early_binding.concat is pandas.concat,
              isinstance(sys.modules["pandas"], deferred.DeferredModule))
        """
    )

    assert out == ["pandas", "True", "True", "True", "False"]


def test_the_kubernetes_client_works_through_names_bound_before_it_loaded():
    out = _run(
        """
        from kserve.api import kserve_client  # binds `client` and `config` while they are stand-ins
        meta = kserve_client.client.V1ObjectMeta(name="tts", namespace="tts")
        import kubernetes.client
        print(type(meta) is kubernetes.client.V1ObjectMeta, meta.name,
              callable(kserve_client.config.load_kube_config))
        """
    )

    assert out == ["True", "tts", "True"]


def test_a_module_not_installed_or_already_imported_is_left_alone():
    out = _run(
        """
        import json
        done = deferred.defer({"json": ((), ()), "no_such_module_anywhere": ((), ())})
        try:
            import no_such_module_anywhere
        except ImportError:
            missing = "ImportError"
        print(done == [], sys.modules["json"] is json, missing)
        """
    )

    assert out == ["True", "True", "ImportError"]
