"""A DeepSpeed baseline after something in the process destroyed the default process group (another library,
a test): DeepSpeed's cached group handles point into the destroyed group ("Group ... is not registered"), so
``ensure_process_group`` forgets them when it makes a new one."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from baselines._common import ensure_process_group

pytestmark = pytest.mark.usefixtures("needs_deepspeed")


def test_a_new_default_group_forgets_deepspeeds_handles_into_the_old_one() -> None:
    import deepspeed
    from deepspeed.utils import groups

    if dist.is_initialized():  # left by an earlier test in this process: start from none
        dist.destroy_process_group()
    ensure_process_group("cpu")
    deepspeed.init_distributed(dist_backend="gloo")
    old = groups._clone_world_group()  # DeepSpeed keeps this handle in a module global
    assert groups._get_broadcast_src_rank() == 0
    dist.destroy_process_group()

    ensure_process_group("cpu")
    assert groups._get_broadcast_src_rank() == 0  # raised "Group ... is not registered" before
    assert groups._clone_world_group() is not old
