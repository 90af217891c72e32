"""Fixture for check_safetensors: a safetensors file written by the Python
side (tools/grove_export.py's save_safetensors) from a small torch
state_dict of every dtype Grove reads, and a JSON sidecar with what the C
reader must find in it.

    safetensors_dtypes.safetensors
    safetensors_dtypes.json   {"keys": [{"key", "dtype", "shape", "hex"}, ...]}

"hex" is the tensor's contiguous little-endian bytes, so the C test compares
bits exactly; "dtype" is the safetensors name.
"""
import collections
import json
import os

from grove_export import save_safetensors


def _st_name(t):
    import torch
    return {
        torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
        torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
        torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
    }[t.dtype]


def _le_bytes(t):
    import torch
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().astype("<i2").tobytes()
    a = t.numpy()
    return a.astype(a.dtype.newbyteorder("<")).tobytes()


def generate(out_dir):
    import torch
    g = torch.Generator().manual_seed(20240601)
    lin = torch.nn.Linear(4, 3)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(3, 4, generator=g))
        lin.bias.copy_(torch.randn(3, generator=g))
    bn = torch.nn.BatchNorm1d(3)
    sd = collections.OrderedDict()
    # A real module's state_dict first (f32 parameters, f32 buffers, the i64
    # 0-d num_batches_tracked), then one tensor of each remaining dtype.
    for k, v in lin.state_dict().items():
        sd["lin." + k] = v
    for k, v in bn.state_dict().items():
        sd["bn." + k] = v
    sd["half"] = torch.randn(2, 3, generator=g).to(torch.float16)
    sd["brain"] = torch.randn(5, generator=g).to(torch.bfloat16)
    sd["double"] = torch.randn(2, 2, generator=g, dtype=torch.float64)
    sd["long"] = torch.tensor([-(2 ** 40), -1, 0, 7, 2 ** 62], dtype=torch.int64)
    sd["int"] = torch.tensor([[-5, 6], [2 ** 31 - 1, -(2 ** 31)]], dtype=torch.int32)
    sd["short"] = torch.tensor([-300, 300, 1], dtype=torch.int16)
    sd["byte"] = torch.tensor([0, 1, 255], dtype=torch.uint8)
    sd["char"] = torch.tensor([-128, 0, 127], dtype=torch.int8)
    sd["mask"] = torch.tensor([[True, False, True], [False, False, True]])
    sd["empty"] = torch.zeros(0, 3)
    # Not contiguous in torch: the writer stores it contiguous.
    sd["transposed"] = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    # A non-ASCII key: json.dumps escapes it as \u00f1, the reader must
    # decode it back to UTF-8.
    sd["emb.\u00f1"] = torch.randn(1, 2, generator=g)
    sd["scalar"] = torch.tensor(3.5)

    path = os.path.join(out_dir, "safetensors_dtypes.safetensors")
    save_safetensors(sd, path)
    expected = {"keys": [
        {"key": k, "dtype": _st_name(v), "shape": list(v.shape), "hex": _le_bytes(v).hex()}
        for k, v in sd.items()
    ]}
    with open(os.path.join(out_dir, "safetensors_dtypes.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
        f.write("\n")
