"""The model behaviour checks (tests/behaviour.py) on one OpenCL device, once per device."""
import pytest
from behaviour import Backend, ModelBehaviour

import clmf


class TestSingleDevice(ModelBehaviour):
    """``clmf.ALS(device=d)`` for every OpenCL device d (``cl_device``)."""

    @pytest.fixture
    def backend(self, cl_device):
        """The single-device estimator on ``cl_device``."""
        return Backend(lambda **kw: clmf.ALS(device=cl_device, **kw))
