"""LoRA checkpoints: the adapters (and their optimizer state) alone, plus the identity of the base weights they
adapt, so that a checkpoint of a 7B model's adapters is megabytes, and can never be put back onto other weights.

The identity is the base checkpoint's absolute path and SHA-256 (`base_identity`), recorded in every checkpoint's
manifest under "lora_base". Whoever needs the full weights (resume, `ms-llm sample`, `convert --merge-lora`) reads
the base from that path and checks its SHA-256 first (`read_base`): a base that moved or changed is refused with
one paragraph naming both hashes.
"""
import os

from ms_llm.errors import UserError
from ms_llm.fileio import sha256_file

BASE_KEY = "lora_base"


def base_identity(path):
    return {"path": os.path.abspath(path), "sha256": sha256_file(path)}


def read_base(identity, where):
    """{name: array} of the base weights named by `identity`, after checking they are the same file."""
    from ms_llm.checkpoint import store

    path, want = identity.get("path"), identity.get("sha256")
    if not path or not os.path.isfile(path):
        raise UserError(f"{where} holds LoRA adapters of the base weights '{path}', which do not exist any more. "
                        f"Put the base checkpoint back at that path (SHA-256 {str(want)[:16]}…), or merge the "
                        f"adapters where it exists (ms-llm convert --merge-lora).")
    got = sha256_file(path)
    if got != want:
        raise UserError(f"{where} holds LoRA adapters of '{path}' with SHA-256 {str(want)[:16]}…, but that file now "
                        f"has {got[:16]}…: it was replaced or changed, and the adapters fit only the weights they "
                        f"were trained on. Restore the original base checkpoint.")
    return store.read_tensors(path)


def full_weights(adapter_arrays, identity, where):
    """Base weights + the checkpoint's adapters: what a model with LoRA applied loads."""
    arrays = dict(read_base(identity, where))
    arrays.update(adapter_arrays)
    return arrays
