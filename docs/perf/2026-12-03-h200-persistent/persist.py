"""pytest plugin (-p persist): every wgmma forward kernel that can be persistent (head_dim up to
128, a dense call) is, with one CTA per SM of the GPU at hand."""
import dataclasses

import torch

import cute_fa.tuning as T

_SM90_KEY = T.sm90_key
SMS = torch.cuda.get_device_properties(0).multi_processor_count


def sm90_key(*args, **features):
    key = _SM90_KEY(*args, **features)
    if key.tile.head_dim_padded <= 128 and not (key.varlen_q or key.varlen_k):
        key = dataclasses.replace(key, persistent=SMS)
    return key


T.sm90_key = sm90_key


def pytest_report_header(config):
    return f"persist: the wgmma forward persistent on {SMS} CTAs up to head_dim 128"
