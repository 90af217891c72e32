"""grove_safetensors: the safetensors writer tools/grove_export.py uses
(and re-exports as grove_export.save_safetensors).  Self-contained: Debian
packages no safetensors module.  Needs torch."""
import json
import struct

_ST_DTYPES = None


def _st_dtypes():
    global _ST_DTYPES
    if _ST_DTYPES is None:
        import torch
        _ST_DTYPES = {
            torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
            torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
            torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
        }
    return _ST_DTYPES


def save_safetensors(tensors, path, metadata=None):
    """Writes an ordered mapping name -> torch.Tensor as a safetensors file:
    8-byte little-endian header length, JSON header (padded with spaces to a
    multiple of 8), then the tensors' little-endian bytes.  The header keeps
    the mapping's order; the data is laid out by decreasing element size (as
    the reference writer does), so every tensor is aligned to its element
    size and Grove maps every float32 tensor without copying it."""
    import torch
    dtypes = _st_dtypes()
    header = {}
    if metadata is None:
        metadata = {"format": "pt"}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    entries = []
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: not a tensor ({type(t).__name__})")
        if t.dtype not in dtypes:
            raise TypeError(f"{name}: dtype {t.dtype} has no safetensors name")
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            data = t.view(torch.int16).numpy().astype("<i2").tobytes()
        else:
            data = t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape)}
        entries.append((name, t.element_size(), data))
    offset = 0
    blobs = []
    for name, _, data in sorted(entries, key=lambda e: -e[1]):  # stable: key order within a size
        header[name]["data_offsets"] = [offset, offset + len(data)]
        blobs.append(data)
        offset += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
