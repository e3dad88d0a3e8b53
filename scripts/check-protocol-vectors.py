#!/usr/bin/env python3
"""Recomputes docs/src/reference/protocol-vectors.toml from docs/src/reference/protocol.md alone, with Python's
`cryptography` package (pip install cryptography): an implementation independent of the Rust
code. Prints each vector's name and OK; exits 1 on the first mismatch.

    python3 scripts/check-protocol-vectors.py
"""
import hashlib
import struct
import sys
import tomllib
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

ROOT = Path(__file__).resolve().parent.parent
V = tomllib.loads((ROOT / "docs" / "src" / "reference" / "protocol-vectors.toml").read_text())
SALT = b"flp.v1 secure aggregation"
u64 = lambda v: struct.pack(">Q", v)
u32 = lambda v: struct.pack(">I", v)
u16 = lambda v: struct.pack(">H", v)
text = lambda s: u32(len(s.encode())) + s.encode()


def check(name, value):
    expected = V[name]
    if value != expected:
        print(f"{name}: MISMATCH\n  expected {expected}\n  got      {value}")
        sys.exit(1)
    print(f"{name}: OK")


# Task digest: logistic regression 2 -> 2 ("2-2"), tensors "layers.0.weight" [2, 2] and
# "layers.0.bias" [2], E = 1, B = 10, eta = 0.1f, s = 0, b = 32, S = 1.0,
# gamma = 1000.0, sigma^2 = 0, signed = 1, federation "hospitals", run 42, n_min 3, the six
# values.
def task_digest(tensor_names):
    h = hashlib.sha256(b"flp.v1 task" + u64(7) + text("2-2"))
    h.update(u32(len(tensor_names)))
    for name, shape in tensor_names:
        h.update(text(name) + u32(len(shape)) + b"".join(u64(n) for n in shape))
    h.update(u32(1) + u32(10) + struct.pack(">f", 0.1) + u32(0))
    h.update(u32(32) + struct.pack(">d", 1.0) + struct.pack(">d", 1000.0) + u64(0) + b"\x01")
    h.update(text("hospitals") + u64(42) + u64(3))
    values = [0.5, -0.25, 1.0, 0.0, 2.0, -3.0]
    h.update(u64(len(values)) + b"".join(struct.pack("<f", v) for v in values))
    return h.hexdigest()


digest_hex = task_digest([("layers.0.weight", [2, 2]), ("layers.0.bias", [2])])
check("task_digest", digest_hex)
digest = bytes.fromhex(digest_hex)
round_tag = u64(7) + digest


def context(purpose, a, b):
    return purpose + round_tag + u64(a) + u64(b)


def hkdf(shared, info):
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=SALT, info=info).derive(shared)


u = x25519.X25519PrivateKey.from_private_bytes(bytes([1] * 32))
v = x25519.X25519PrivateKey.from_private_bytes(bytes([2] * 32))
raw = lambda k: k.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
check("u_public", raw(u.public_key()).hex())
check("v_public", raw(v.public_key()).hex())
shared = u.exchange(v.public_key())
check("pair_seed_3_5", hkdf(shared, context(b"mask", 3, 5)).hex())
key = hkdf(shared, context(b"share", 3, 5))
sealed = ChaCha20Poly1305(key).encrypt(bytes(12), bytes(range(120)), context(b"share-aad", 3, 5))
check("share_ciphertext_3_to_5", sealed.hex())
for kind, purpose in [("mask_key", b"commit-mask-key"), ("self_mask", b"commit-self-mask")]:
    commitment = hashlib.sha256(SALT + context(purpose, 3, 5) + bytes([0x11] * 48)).hexdigest()
    check(f"commitment_{kind}_3_5", commitment)
stream = Cipher(algorithms.ChaCha20(bytes([0x42] * 32), bytes(16)), mode=None).encryptor()
block = stream.update(bytes(32))
check("mask_z32_first4", [f"{w:016x}" for w in struct.unpack("<4I", block[:16])])
check("mask_z64_first4", [f"{w:016x}" for w in struct.unpack("<4Q", block)])

authority = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([0x55] * 32))
identity = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([0x44] * 32))
check("authority_public", raw(authority.public_key()).hex())
identity_public = raw(identity.public_key())
check("identity_public", identity_public.hex())
certificate = b"flp.v1 identity certificate" + u16(10) + b"hospital-1" + identity_public
check("certificate_signature", authority.sign(certificate).hex())
keys = b"flp.v1 secagg keys" + round_tag + u64(3) + raw(v.public_key()) + raw(u.public_key())
check("keys_payload", keys.hex())
keys_signature = identity.sign(keys)
check("keys_signature", keys_signature.hex())
advert = hashlib.sha256(b"flp.v1 secagg advert" + u64(3) + raw(v.public_key()) + raw(u.public_key())
                        + b"\x01" + keys_signature).digest()
check("advert_digest_3", advert.hex())
members = [(3, "hospital-1", advert), (5, "hospital-2", bytes([5] * 32)),
           (9, "hospital-3", bytes([9] * 32))]
h = hashlib.sha256(b"flp.v1 secagg transcript" + round_tag + u32(len(members)))
for id_, name, digest_of_keys in members:
    h.update(u64(id_) + u16(len(name)) + name.encode() + digest_of_keys)
check("members_digest", h.hexdigest())
survivors = (b"flp.v1 secagg survivors" + round_tag + h.digest() + u32(3)
             + u64(3) + u64(5) + u64(9))
check("survivors_payload", survivors.hex())
check("survivors_signature", identity.sign(survivors).hex())

# The federation policy "hospitals", serial 3: 10 clients, 8 neighbours, t >= 0.75 k, z = 0.5,
# 4 per release, 50 in all at delta 1e-5, values within 1e4; modes ldp-gaussian and secagg.
modes = [b"ldp-gaussian", b"secagg"]
policy = (b"flp.v1 federation policy" + u16(9) + b"hospitals" + u64(3) + u64(10) + u64(8)
          + b"".join(struct.pack(">d", x) for x in [0.75, 0.5, 4.0, 50.0, 1e-5, 1e4])
          + u16(len(modes)) + b"".join(u16(len(m)) + m for m in modes))
check("policy_payload", policy.hex())
check("policy_signature", authority.sign(policy).hex())

# Keys every client refuses: not canonical (u >= p = 2^255 - 19, or the top bit set), or of
# small order (u = 1).
P = 2**255 - 19
refused = [P.to_bytes(32, "little"), (P + 1).to_bytes(32, "little"),
           (int.from_bytes(raw(u.public_key()), "little") | 1 << 255)
           .to_bytes(32, "little"), (1).to_bytes(32, "little")]
check("refused_public_keys", [k.hex() for k in refused])

# The graph: places SHA-256("flp.v1 secagg graph" || round || H(task) || 0x01 || u16 || name),
# U1 in increasing order of place, each joined to the k/2 = 2 next on either side.
sites = [(100 + i, f"site-{i}") for i in range(12)]
place = lambda name: hashlib.sha256(
    b"flp.v1 secagg graph" + round_tag + b"\x01" + u16(len(name)) + name.encode()).digest()
order = [id_ for _, id_ in sorted((place(n), i) for i, n in sites)]
neighbours = {i: set() for i, _ in sites}
for pos, a in enumerate(order):
    for off in (1, 2):
        b = order[(pos + off) % len(order)]
        neighbours[a].add(b)
        neighbours[b].add(a)
check("graph_regular4_sites",
      [f"{a}: {' '.join(str(b) for b in sorted(ns))}" for a, ns in sorted(neighbours.items())])
