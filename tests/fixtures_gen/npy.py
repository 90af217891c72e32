"""NumPy .npy fixtures for tests/check_npy.c, written by numpy itself.

Writes OUT/npy/*.npy and OUT/npy/index.txt.  Each index line is

    FILE STATUS DTYPE IDENTICAL SHAPE

FILE is a .npy file; STATUS the grove_status name grove_npy_read must
return; DTYPE its Grove dtype name ("-" when it must fail); IDENTICAL 1 when
grove_npy_encode of what was read must give the file's exact bytes (numpy.save
of a C-order array, by a numpy that pads headers as Grove does); SHAPE the
dimensions joined by "," ("()" for 0-d, "-" when it must fail).  The element
bytes are checked against FILE.raw, the array's C-order little-endian bytes
(arr.tobytes()), written beside it.
"""
import os

import numpy as np


def generate(out_dir):
    d = os.path.join(out_dir, "npy")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(20240601)
    # numpy >= 1.23 leaves room for the first axis to grow; Grove writes that
    # layout, so byte-identity only holds for files from such a numpy.
    grows = hasattr(np.lib.format, "GROWTH_AXIS_MAX_DIGITS")
    lines = []

    def ok(name, arr, version=None, identical=True):
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            np.lib.format.write_array(f, arr, version=version)
        with open(path + ".raw", "wb") as f:
            f.write(np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes())
        shape = ",".join(str(n) for n in arr.shape) if arr.ndim else "()"
        ident = 1 if (identical and grows and version in (None, (1, 0))) else 0
        lines.append(f"{name} GROVE_OK {arr.dtype.name} {ident} {shape}")

    def bad(name, arr, status, version=None):
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            np.lib.format.write_array(f, arr, version=version)
        lines.append(f"{name} {status} - 0 -")

    ok("f32_2d.npy", rng.standard_normal((3, 4)).astype(np.float32))
    ok("i64_1d.npy", np.array([0, 5, -3, 2**40, -(2**62), 7], dtype=np.int64))
    ok("f64_3d.npy", rng.standard_normal((2, 2, 3)))
    ok("f32_0d.npy", np.array(3.5, dtype=np.float32))
    ok("f32_1x1.npy", np.array([[1.25]], dtype=np.float32))
    ok("f32_empty.npy", np.zeros((0, 5), dtype=np.float32))
    ok("f16.npy", rng.standard_normal(5).astype(np.float16))
    ok("i32.npy", np.arange(-4, 4, dtype=np.int32).reshape(2, 4))
    ok("i16.npy", np.array([-32768, 0, 32767], dtype=np.int16))
    ok("i8.npy", np.array([-128, 1, 127], dtype=np.int8))
    ok("u8.npy", np.array([[0, 200], [255, 3]], dtype=np.uint8))
    ok("bool.npy", np.array([True, False, True], dtype=np.bool_))
    ok("f32_v2.npy", rng.standard_normal((2, 3)).astype(np.float32), version=(2, 0))
    ok("f32_v3.npy", rng.standard_normal((4,)).astype(np.float32), version=(3, 0))
    # A 1-column Fortran array is C-contiguous too, so numpy writes it as C
    # order; a 2x3 one is genuinely Fortran order and Grove refuses it.
    bad("fortran_2d.npy", np.asfortranarray(rng.standard_normal((2, 3)).astype(np.float32)),
        "GROVE_E_UNSUPPORTED")
    bad("f32_big_endian.npy", np.arange(3, dtype=">f4"), "GROVE_E_BAD_DTYPE")
    bad("c64.npy", np.zeros(2, dtype=np.complex64), "GROVE_E_BAD_DTYPE")
    bad("u32.npy", np.zeros(2, dtype=np.uint32), "GROVE_E_BAD_DTYPE")
    bad("structured.npy", np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]), "GROVE_E_BAD_DTYPE")

    with open(os.path.join(d, "index.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
