//! The transparency log's pure building blocks, shared by the server (which keeps the tree and
//! signs checkpoints), the runner (which checks witnessed inclusion proofs) and the witness
//! (`emisar witness`, which cosigns checkpoints): no IO, nothing async, and it builds in the
//! runner's `--no-default-features` build.
//!
//! - [`tree`]: the RFC 6962 / RFC 9162 Merkle tree over a store of complete subtrees
//!   ([`tree::SubtreeHashes`]): tree heads, the subtrees an append writes, inclusion and
//!   consistency proofs, and their verification (RFC 9162 §2.1.3.2 and §2.1.4.2).
//! - [`keys`]: signed-note keys as text (private keys, verifier keys of type 0x01 and 0x04).
//! - [`checkpoint`]: C2SP `tlog-checkpoint` signed notes: sign, parse, verify.
//! - [`cosignature`]: C2SP `tlog-cosignature` (`cosignature/v1`), a witness's signature.

pub mod checkpoint;
pub mod cosignature;
pub mod keys;
pub mod tree;
