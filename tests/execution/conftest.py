import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    """A local 2-CPU Ray cluster for the whole session (tests skip if Ray is missing)."""
    ray = pytest.importorskip("ray")
    import _ray_faults
    import _ray_jobs

    # Workers cannot import the test helpers by name: ship their code with the functions.
    ray.cloudpickle.register_pickle_by_value(_ray_faults)
    ray.cloudpickle.register_pickle_by_value(_ray_jobs)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()
