"""pytest plugin (-p force80): the backward GPU tests with head_dim 128 on 80-query blocks (dQ
computed transposed, dV issued after dS) instead of its shipped tile."""
import cute_fa.tuning as T

T.BWD_SM90_TILES = {**T.BWD_SM90_TILES, 128: (80, 2, 2, 1, False, True, 64, True)}


def pytest_report_header(config):
    return f"force80: {T.BWD_SM90_TILES!r}"
