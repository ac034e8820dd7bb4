"""The shared-memory records are defined once: the C structs and the Python layouts are checked against each other."""

import numpy as np
import pytest

from otel_rl.shm import segment as shm
from otel_rl.training import _hotpath  # the test command always builds it


def _offsets(dtype: np.dtype) -> dict[str, int]:
    return {name: dtype.fields[name][1] for name in dtype.names}


@pytest.mark.parametrize(
    ("struct_name", "python"),
    [("ShmRecord", shm.RECORD), ("ShmLaneHeader", shm.LANE_HEADER), ("ScalarEntry", shm.SCALAR_ENTRY)],
)
def test_c_structs_and_numpy_layouts_agree(struct_name, python):
    layout = dict(_hotpath.layouts[struct_name])
    assert layout.pop("itemsize") == python.itemsize
    assert layout == _offsets(python)


def test_the_packed_scalars_header_agrees_with_its_struct():
    layout = dict(_hotpath.layouts["ScalarsHeader"])
    assert layout.pop("itemsize") == shm.SCALARS_HEADER.size
    assert list(layout.values()) == [0, 8, 16, 24, 32]  # "<qqqqII": four int64, then the count


def test_the_pure_python_lane_packs_the_same_record():
    import struct

    assert struct.calcsize("<" + "".join(shm.RECORD_STRUCT)) == shm.RECORD.itemsize
    assert struct.calcsize("<" + shm.SCALAR_ENTRY_STRUCT) == shm.SCALAR_ENTRY.itemsize
