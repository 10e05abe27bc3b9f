"""The model behaviour checks (tests/behaviour.py) on ``clmf.dask.ALS``: a LocalCluster of 2
worker processes (one thread each) on PoCL, fed the SciPy matrices (scattered to the workers, so
the shapes keep their empty rows and columns)."""
import pytest
from behaviour import Backend, ModelBehaviour
from conftest import DEVICES

distributed = pytest.importorskip("distributed")
import clmf.dask  # noqa: E402  (after the skip: the extra may be missing outside CI)

HAVE_POCL = any("portable" in d.platform.name.lower() for d in DEVICES)
pytestmark = pytest.mark.skipif(not HAVE_POCL, reason="the Dask workers run on PoCL")


@pytest.fixture(scope="module")
def dask_client():
    """A LocalCluster of 2 single-threaded worker processes and its client."""
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=40)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


class TestDask(ModelBehaviour):
    """``clmf.dask.ALS`` on two PoCL workers (the partitioned fit sums in another order)."""

    @pytest.fixture
    def backend(self, dask_client):
        """The Dask estimator on the module's cluster."""
        return Backend(lambda **kw: clmf.dask.ALS(client=dask_client, device="Portable", **kw),
                       rtol=1e-4)
