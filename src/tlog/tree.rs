//! The Merkle tree of RFC 6962 / RFC 9162 §2.1 over a store of complete subtrees: tree heads,
//! the nodes an append writes, inclusion and consistency proofs, and their verification.
//!
//! Hashing, proof generation and the append are `tlog_tiles`' (a port of Go's `sumdb/tlog`,
//! the code behind the Go checksum database and static CT logs). The store is addressed here by
//! `(level, index)` of complete subtrees ([`Subtree`]) rather than by `tlog_tiles`' stored-hash
//! index, and its errors are the store's own; [`Reader`] translates. Verification is written
//! here by hand, step for step after RFC 9162 §2.1.3.2 and §2.1.4.2 (`tlog_tiles` verifies with
//! Go's recursive algorithm; the unit tests check that both agree), so an auditor can read it
//! next to the RFC.

use std::cell::RefCell;

pub use tlog_tiles::{EMPTY_HASH, Hash, node_hash, record_hash};
use tlog_tiles::{HashReader, split_stored_hash_index, stored_hash_index};

/// The most hashes a proof may hold: a tree of at most 2^63 leaves has proofs of at most 63
/// inclusion hashes and 2·63 consistency hashes; anything longer is refused before hashing.
pub const MAX_PROOF_HASHES: usize = 2 * 63;

/// A complete subtree: `2^level` leaves starting at leaf `index · 2^level`. Level 0 is a leaf.
/// A store keeps exactly the subtrees [`append`] returns; every other hash is computed from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Subtree {
    pub level: u8,
    pub index: u64,
}

/// Where the tree's complete subtrees are kept (the audit store, or [`MemoryTree`]).
pub trait SubtreeHashes {
    type Error;
    /// The hashes of `nodes`, in the order asked. Every node asked is a complete subtree of a
    /// tree the caller says exists; a missing one is the store's error. One proof asks once,
    /// so a SQL store answers it with one query.
    fn subtree_hashes(&self, nodes: &[Subtree]) -> Result<Vec<Hash>, Self::Error>;
}

/// A tree operation failed: the store failed, or the sizes asked for do not exist.
#[derive(Debug, thiserror::Error)]
pub enum TreeError<E> {
    #[error("failed to read tree hashes")]
    Store(#[source] E),
    #[error("{0}")]
    Range(String),
    #[error("the store answered {got} hashes for {asked} subtrees")]
    ShortAnswer { asked: usize, got: usize },
    #[error("tree maths failed: {0}")]
    Tree(#[from] tlog_tiles::Error),
}

/// Adapts a [`SubtreeHashes`] store to `tlog_tiles`' `HashReader` (stored-hash indexes), and
/// keeps the store's own error, which `HashReader` cannot carry.
struct Reader<'a, S: SubtreeHashes> {
    store: &'a S,
    failure: RefCell<Option<TreeError<S::Error>>>,
}

impl<'a, S: SubtreeHashes> Reader<'a, S> {
    fn new(store: &'a S) -> Self {
        Reader {
            store,
            failure: RefCell::new(None),
        }
    }

    /// The store's failure if there was one, else `tlog_tiles`' error.
    fn error(&self, e: tlog_tiles::Error) -> TreeError<S::Error> {
        self.failure.take().unwrap_or(TreeError::Tree(e))
    }
}

impl<S: SubtreeHashes> HashReader for Reader<'_, S> {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, tlog_tiles::Error> {
        let nodes: Vec<Subtree> = indexes
            .iter()
            .map(|&i| {
                let (level, index) = split_stored_hash_index(i);
                Subtree { level, index }
            })
            .collect();
        match self.store.subtree_hashes(&nodes) {
            // tlog_tiles panics on a short answer; refuse it here instead.
            Ok(hashes) if hashes.len() == nodes.len() => Ok(hashes),
            Ok(hashes) => {
                *self.failure.borrow_mut() = Some(TreeError::ShortAnswer {
                    asked: nodes.len(),
                    got: hashes.len(),
                });
                Err(tlog_tiles::Error::IndexesNotInTree)
            }
            Err(e) => {
                *self.failure.borrow_mut() = Some(TreeError::Store(e));
                Err(tlog_tiles::Error::IndexesNotInTree)
            }
        }
    }
}

/// The leaf hash of an entry: SHA-256(0x00 ‖ bytes).
pub fn leaf_hash(entry: &[u8]) -> Hash {
    record_hash(entry)
}

/// The subtrees to store when leaf number `size` (0-based: the tree grows from `size` to
/// `size + 1` leaves) with hash `leaf` is appended: the leaf itself, then every subtree it
/// completes, lowest first (1 + trailing ones of `size` nodes). Reads the left siblings, one
/// call. Nothing already stored changes: the tree is append-only.
pub fn append<S: SubtreeHashes>(
    size: u64,
    leaf: Hash,
    store: &S,
) -> Result<Vec<(Subtree, Hash)>, TreeError<S::Error>> {
    let reader = Reader::new(store);
    let hashes = tlog_tiles::stored_hashes_for_record_hash(size, leaf, &reader)
        .map_err(|e| reader.error(e))?;
    let first = stored_hash_index(0, size);
    Ok(hashes
        .into_iter()
        .zip(first..)
        .map(|(hash, i)| {
            let (level, index) = split_stored_hash_index(i);
            (Subtree { level, index }, hash)
        })
        .collect())
}

/// The root hash of the tree of the first `size` leaves (MTH of RFC 6962 §2.1); the empty tree's
/// is SHA-256 of nothing. Reads at most 1 + log₂ size subtrees.
pub fn tree_head<S: SubtreeHashes>(size: u64, store: &S) -> Result<Hash, TreeError<S::Error>> {
    let reader = Reader::new(store);
    tlog_tiles::tree_hash(size, &reader).map_err(|e| reader.error(e))
}

/// The inclusion proof (audit path, RFC 9162 §2.1.3.1) of leaf `index` in the tree of `size`.
pub fn inclusion_proof<S: SubtreeHashes>(
    size: u64,
    index: u64,
    store: &S,
) -> Result<Vec<Hash>, TreeError<S::Error>> {
    if index >= size {
        return Err(TreeError::Range(format!(
            "leaf {index} is not in a tree of {size} leaves"
        )));
    }
    let reader = Reader::new(store);
    tlog_tiles::prove_record(size, index, &reader).map_err(|e| reader.error(e))
}

/// The consistency proof (RFC 9162 §2.1.4.1) from the tree of `old` leaves to the tree of
/// `new` leaves: empty when `old` is 0 or equal to `new`.
pub fn consistency_proof<S: SubtreeHashes>(
    old: u64,
    new: u64,
    store: &S,
) -> Result<Vec<Hash>, TreeError<S::Error>> {
    if old > new {
        return Err(TreeError::Range(format!(
            "a tree of {old} leaves cannot be proven consistent with a smaller one of {new}"
        )));
    }
    if old == 0 || old == new {
        return Ok(Vec::new());
    }
    let reader = Reader::new(store);
    tlog_tiles::prove_tree(new, old, &reader).map_err(|e| reader.error(e))
}

/// Why a proof did not verify. Every failure is a refusal; the variants only say why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("leaf {index} is not in a tree of {size} leaves")]
    IndexOutOfRange { index: u64, size: u64 },
    #[error("the old tree ({old} leaves) is larger than the new one ({new})")]
    OldLarger { old: u64, new: u64 },
    #[error("the proof has {got} hashes, more than any tree has ({max})")]
    TooLong { got: usize, max: usize },
    #[error("the proof has the wrong number of hashes for these sizes")]
    WrongLength,
    #[error("the proof does not lead to the root hash")]
    Mismatch,
}

fn lsb(x: u64) -> bool {
    x & 1 == 1
}

/// Verifies that `leaf` is leaf number `index` of the tree of `size` leaves with root `root`:
/// RFC 9162 §2.1.3.2, step for step.
pub fn verify_inclusion(
    leaf: Hash,
    index: u64,
    size: u64,
    proof: &[Hash],
    root: Hash,
) -> Result<(), ProofError> {
    if proof.len() > MAX_PROOF_HASHES {
        return Err(ProofError::TooLong {
            got: proof.len(),
            max: MAX_PROOF_HASHES,
        });
    }
    // 1. Compare leaf_index against tree_size.
    if index >= size {
        return Err(ProofError::IndexOutOfRange { index, size });
    }
    // 2. Set fn to leaf_index and sn to tree_size - 1.
    let (mut f_n, mut s_n) = (index, size - 1);
    // 3. Set r to hash.
    let mut r = leaf;
    // 4. For each value p in the inclusion_path array:
    for p in proof {
        // a. If sn is 0, then stop the iteration and fail the proof verification.
        if s_n == 0 {
            return Err(ProofError::WrongLength);
        }
        // b. If LSB(fn) is set, or if fn is equal to sn, then:
        if lsb(f_n) || f_n == s_n {
            // 1. Set r to HASH(0x01 || p || r).
            r = node_hash(*p, r);
            // 2. If LSB(fn) is not set, then right-shift both fn and sn equally until either
            //    LSB(fn) is set or fn is 0.
            if !lsb(f_n) {
                while !lsb(f_n) && f_n != 0 {
                    f_n >>= 1;
                    s_n >>= 1;
                }
            }
        } else {
            // Otherwise: set r to HASH(0x01 || r || p).
            r = node_hash(r, *p);
        }
        // c. Finally, right-shift both fn and sn one time.
        f_n >>= 1;
        s_n >>= 1;
    }
    // 5. Compare sn to 0. Compare r against the root_hash.
    if s_n != 0 {
        return Err(ProofError::WrongLength);
    }
    if r != root {
        return Err(ProofError::Mismatch);
    }
    Ok(())
}

/// Verifies that the tree of `new` leaves with root `new_root` extends the tree of `old`
/// leaves with root `old_root`: RFC 9162 §2.1.4.2, step for step, after the cases the RFC
/// leaves to the caller (old 0: every tree extends the empty one, the proof is empty; equal
/// sizes: the proof is empty and the roots are equal).
pub fn verify_consistency(
    old: u64,
    new: u64,
    old_root: Hash,
    new_root: Hash,
    proof: &[Hash],
) -> Result<(), ProofError> {
    if proof.len() > MAX_PROOF_HASHES {
        return Err(ProofError::TooLong {
            got: proof.len(),
            max: MAX_PROOF_HASHES,
        });
    }
    if old > new {
        return Err(ProofError::OldLarger { old, new });
    }
    if old == 0 || old == new {
        if !proof.is_empty() {
            return Err(ProofError::WrongLength);
        }
        let empty_ok = old != 0 || old_root == EMPTY_HASH;
        let same_ok = old != new || old_root == new_root;
        if !empty_ok || !same_ok {
            return Err(ProofError::Mismatch);
        }
        return Ok(());
    }
    // 1. If consistency_path is an empty array, stop and fail the proof verification.
    if proof.is_empty() {
        return Err(ProofError::WrongLength);
    }
    // 2. If first is an exact power of 2, then prepend first_hash to the consistency_path.
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if old.is_power_of_two() {
        path.push(old_root);
    }
    path.extend_from_slice(proof);
    // 3. Set fn to first - 1 and sn to second - 1.
    let (mut f_n, mut s_n) = (old - 1, new - 1);
    // 4. If LSB(fn) is set, then right-shift both fn and sn equally until LSB(fn) is not set.
    while lsb(f_n) {
        f_n >>= 1;
        s_n >>= 1;
    }
    // 5. Set both fr and sr to the first value in the consistency_path array.
    let (mut f_r, mut s_r) = (path[0], path[0]);
    // 6. For each subsequent value c in the consistency_path array:
    for c in &path[1..] {
        // a. If sn is 0, then stop the iteration and fail the proof verification.
        if s_n == 0 {
            return Err(ProofError::WrongLength);
        }
        // b. If LSB(fn) is set, or if fn is equal to sn, then:
        if lsb(f_n) || f_n == s_n {
            // 1. Set fr to HASH(0x01 || c || fr). 2. Set sr to HASH(0x01 || c || sr).
            f_r = node_hash(*c, f_r);
            s_r = node_hash(*c, s_r);
            // 3. If LSB(fn) is not set, then right-shift both fn and sn equally until either
            //    LSB(fn) is set or fn is 0.
            if !lsb(f_n) {
                while !lsb(f_n) && f_n != 0 {
                    f_n >>= 1;
                    s_n >>= 1;
                }
            }
        } else {
            // Otherwise: set sr to HASH(0x01 || sr || c).
            s_r = node_hash(s_r, *c);
        }
        // c. Finally, right-shift both fn and sn one time.
        f_n >>= 1;
        s_n >>= 1;
    }
    // 7. Verify that fr equals first_hash, sr equals second_hash, and sn is 0.
    if s_n != 0 {
        return Err(ProofError::WrongLength);
    }
    if f_r != old_root || s_r != new_root {
        return Err(ProofError::Mismatch);
    }
    Ok(())
}

/// A tree kept in memory, one vector of complete-subtree hashes per level: what a store keeps,
/// for tests and for tools that hold a small log. Appending writes only the new subtrees.
#[derive(Default, Debug, Clone)]
pub struct MemoryTree {
    levels: Vec<Vec<Hash>>,
}

/// [`MemoryTree`] was asked for a subtree it does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("subtree {0:?} is not in the tree")]
pub struct MissingSubtree(pub Subtree);

impl MemoryTree {
    /// The number of leaves.
    pub fn size(&self) -> u64 {
        self.levels.first().map_or(0, |l| l.len() as u64)
    }

    /// Appends an entry (hashed as a leaf) and returns its leaf index.
    pub fn push(&mut self, entry: &[u8]) -> u64 {
        self.push_hash(leaf_hash(entry))
    }

    /// Appends a leaf hash and returns its leaf index.
    pub fn push_hash(&mut self, leaf: Hash) -> u64 {
        let index = self.size();
        let nodes = append(index, leaf, self).expect("a memory tree holds every left sibling");
        for (node, hash) in nodes {
            let level = usize::from(node.level);
            if self.levels.len() <= level {
                self.levels.resize_with(level + 1, Vec::new);
            }
            debug_assert_eq!(self.levels[level].len() as u64, node.index);
            self.levels[level].push(hash);
        }
        index
    }

    /// The root of the current tree.
    pub fn root(&self) -> Hash {
        tree_head(self.size(), self).expect("a memory tree holds its own subtrees")
    }
}

impl SubtreeHashes for MemoryTree {
    type Error = MissingSubtree;
    fn subtree_hashes(&self, nodes: &[Subtree]) -> Result<Vec<Hash>, MissingSubtree> {
        nodes
            .iter()
            .map(|&n| {
                self.levels
                    .get(usize::from(n.level))
                    .and_then(|l| usize::try_from(n.index).ok().and_then(|i| l.get(i)))
                    .copied()
                    .ok_or(MissingSubtree(n))
            })
            .collect()
    }
}

/// The right edge of a tree: the complete subtrees its size decomposes into (one per set bit
/// of the size, largest first). That is all an append reads and all a tree head needs, so a
/// writer that keeps it appends without reading the store, and a verifier that has it extends
/// a kept tree with new leaves in memory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Frontier {
    size: u64,
    /// `(subtree, hash)` for each subtree of [`Frontier::subtrees_of`]`(size)`, in that order.
    nodes: Vec<(Subtree, Hash)>,
}

/// A [`Frontier`] was built from hashes that do not match the subtrees of its size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a frontier of {size} leaves needs {expected} subtree hashes, got {got}")]
pub struct FrontierMismatch {
    pub size: u64,
    pub expected: usize,
    pub got: usize,
}

impl Frontier {
    /// The complete subtrees a tree of `size` leaves decomposes into, largest first: for each
    /// set bit `l` of `size`, the subtree of level `l` that ends where the bits above it end.
    pub fn subtrees_of(size: u64) -> Vec<Subtree> {
        (0..64u8)
            .rev()
            .filter(|&l| size >> l & 1 == 1)
            .map(|l| Subtree {
                level: l,
                index: (size >> l) - 1,
            })
            .collect()
    }

    /// The frontier of a tree of `size` leaves from the hashes of [`Frontier::subtrees_of`]
    /// `(size)`, in that order (as a store answers them).
    pub fn new(size: u64, hashes: Vec<Hash>) -> Result<Self, FrontierMismatch> {
        let subtrees = Self::subtrees_of(size);
        if subtrees.len() != hashes.len() {
            return Err(FrontierMismatch {
                size,
                expected: subtrees.len(),
                got: hashes.len(),
            });
        }
        Ok(Frontier {
            size,
            nodes: subtrees.into_iter().zip(hashes).collect(),
        })
    }

    /// The number of leaves.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Appends a leaf hash; returns the subtrees a store must keep for it (as [`append`]).
    pub fn push(&mut self, leaf: Hash) -> Vec<(Subtree, Hash)> {
        let written = append(self.size, leaf, &*self).expect("a frontier holds every left sibling");
        self.size += 1;
        let keep = Self::subtrees_of(self.size);
        let mut nodes = Vec::with_capacity(keep.len());
        for subtree in keep {
            let hash = written
                .iter()
                .chain(&self.nodes)
                .find(|(s, _)| *s == subtree)
                .map(|(_, h)| *h)
                .expect("the new frontier is made of the old one and the subtrees just completed");
            nodes.push((subtree, hash));
        }
        self.nodes = nodes;
        written
    }

    /// The root hash of the tree (MTH of RFC 6962 §2.1).
    pub fn root(&self) -> Hash {
        tree_head(self.size, self).expect("a frontier holds the subtrees of its tree head")
    }
}

impl SubtreeHashes for Frontier {
    type Error = MissingSubtree;
    fn subtree_hashes(&self, nodes: &[Subtree]) -> Result<Vec<Hash>, MissingSubtree> {
        nodes
            .iter()
            .map(|n| {
                self.nodes
                    .iter()
                    .find(|(s, _)| s == n)
                    .map(|(_, h)| *h)
                    .ok_or(MissingSubtree(*n))
            })
            .collect()
    }
}

/// The subtrees `operation` reads from its store, whatever their hashes: which nodes a tree
/// head or a proof needs depends only on the sizes and indexes asked, so an async store (the
/// audit database) first learns them here, fetches them in one query, then runs the operation
/// again over [`SubtreeMap`].
pub fn subtrees_read_by<T>(operation: impl FnOnce(&Recorder) -> T) -> Vec<Subtree> {
    let recorder = Recorder::default();
    let _ = operation(&recorder);
    recorder.0.into_inner()
}

/// A store that answers every subtree with zeros and remembers what it was asked
/// ([`subtrees_read_by`]).
#[derive(Default)]
pub struct Recorder(RefCell<Vec<Subtree>>);

impl SubtreeHashes for Recorder {
    type Error = std::convert::Infallible;
    fn subtree_hashes(&self, nodes: &[Subtree]) -> Result<Vec<Hash>, Self::Error> {
        self.0.borrow_mut().extend_from_slice(nodes);
        Ok(vec![Hash::default(); nodes.len()])
    }
}

/// Subtree hashes fetched ahead (see [`subtrees_read_by`]).
#[derive(Debug, Default, Clone)]
pub struct SubtreeMap(pub std::collections::HashMap<Subtree, Hash>);

impl SubtreeHashes for SubtreeMap {
    type Error = MissingSubtree;
    fn subtree_hashes(&self, nodes: &[Subtree]) -> Result<Vec<Hash>, MissingSubtree> {
        nodes
            .iter()
            .map(|n| self.0.get(n).copied().ok_or(MissingSubtree(*n)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // RFC 6962 test inputs and tree heads of the Certificate Transparency reference
    // implementation, as carried in transparency-dev/merkle `testonly/reference_test.go`.
    const LEAVES: [&str; 8] = [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ];
    const ROOTS: [&str; 9] = [
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    ];
    const P_5F08: &str = "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e";
    const P_96A2: &str = "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7";
    const P_BC1A: &str = "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b";
    const P_CA85: &str = "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0";
    const P_6B47: &str = "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4";
    const P_0EBC: &str = "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a";
    /// (leaf index, tree size, audit path)
    const INCLUSION: &[(u64, u64, &[&str])] = &[
        (0, 1, &[]),
        (0, 2, &[P_96A2]),
        (1, 2, &[ROOTS[1]]),
        (2, 3, &[ROOTS[2]]),
        (1, 5, &[ROOTS[1], P_5F08, P_BC1A]),
        (0, 8, &[P_96A2, P_5F08, P_6B47]),
        (5, 8, &[P_BC1A, P_CA85, ROOTS[4]]),
    ];
    /// (old size, new size, consistency proof)
    const CONSISTENCY: &[(u64, u64, &[&str])] = &[
        (1, 1, &[]),
        (1, 8, &[P_96A2, P_5F08, P_6B47]),
        (6, 8, &[P_0EBC, P_CA85, ROOTS[4]]),
        (2, 5, &[P_5F08, P_BC1A]),
    ];

    fn h(s: &str) -> Hash {
        Hash(hex::decode(s).unwrap().try_into().unwrap())
    }

    fn reference_tree(n: usize) -> MemoryTree {
        let mut t = MemoryTree::default();
        for leaf in &LEAVES[..n] {
            t.push(&hex::decode(leaf).unwrap());
        }
        t
    }

    #[test]
    fn rfc6962_roots_of_sizes_0_to_8() {
        let full = reference_tree(8);
        for (n, root) in ROOTS.iter().enumerate() {
            assert_eq!(reference_tree(n).root(), h(root), "root of size {n}");
            assert_eq!(tree_head(n as u64, &full).unwrap(), h(root));
        }
    }

    #[test]
    fn rfc6962_inclusion_vectors() {
        let t = reference_tree(8);
        for &(i, n, want) in INCLUSION {
            let want: Vec<Hash> = want.iter().map(|s| h(s)).collect();
            let proof = inclusion_proof(n, i, &t).unwrap();
            assert_eq!(proof, want, "inclusion {i}@{n}");
            let leaf = leaf_hash(&hex::decode(LEAVES[i as usize]).unwrap());
            verify_inclusion(leaf, i, n, &proof, h(ROOTS[n as usize])).unwrap();
        }
    }

    #[test]
    fn rfc6962_consistency_vectors() {
        let t = reference_tree(8);
        for &(old, new, want) in CONSISTENCY {
            let want: Vec<Hash> = want.iter().map(|s| h(s)).collect();
            let proof = consistency_proof(old, new, &t).unwrap();
            assert_eq!(proof, want, "consistency {old}->{new}");
            verify_consistency(
                old,
                new,
                h(ROOTS[old as usize]),
                h(ROOTS[new as usize]),
                &proof,
            )
            .unwrap();
        }
    }

    #[test]
    fn appends_write_only_the_completed_subtrees() {
        let mut t = MemoryTree::default();
        for i in 0..16u64 {
            let nodes = append(i, leaf_hash(&i.to_be_bytes()), &t).unwrap();
            assert_eq!(nodes.len() as u32, 1 + i.trailing_ones(), "append {i}");
            assert_eq!(nodes[0].0, Subtree { level: 0, index: i });
            t.push(&i.to_be_bytes());
        }
        // 16 leaves: 16 + 8 + 4 + 2 + 1 stored subtrees.
        assert_eq!(t.levels.iter().map(Vec::len).sum::<usize>(), 31);
    }

    #[test]
    fn a_frontier_appends_and_roots_as_the_whole_tree_does() {
        let mut whole = MemoryTree::default();
        let mut edge = Frontier::default();
        for i in 0..300u32 {
            let leaf = leaf_hash(&i.to_be_bytes());
            let size = whole.size();
            let expected = append(size, leaf, &whole).unwrap();
            whole.push_hash(leaf);
            assert_eq!(edge.push(leaf), expected, "nodes written for leaf {i}");
            assert_eq!(edge.root(), whole.root(), "root of {} leaves", i + 1);
            let subtrees = Frontier::subtrees_of(edge.size());
            let hashes = whole.subtree_hashes(&subtrees).unwrap();
            assert_eq!(Frontier::new(edge.size(), hashes).unwrap(), edge);
        }
        assert_eq!(
            Frontier::subtrees_of(6),
            vec![
                Subtree { level: 2, index: 0 },
                Subtree { level: 1, index: 2 }
            ]
        );
        assert!(Frontier::new(6, vec![Hash::default()]).is_err());
    }

    #[test]
    fn recorded_subtrees_are_exactly_what_a_proof_reads() {
        let tree = reference_tree(8);
        for (old, new) in [(3u64, 7u64), (1, 8), (5, 6)] {
            let asked = subtrees_read_by(|r| consistency_proof(old, new, r).map(|_| ()));
            let map = SubtreeMap(
                asked
                    .iter()
                    .map(|&s| (s, tree.subtree_hashes(&[s]).unwrap()[0]))
                    .collect(),
            );
            assert_eq!(
                consistency_proof(old, new, &map).unwrap(),
                consistency_proof(old, new, &tree).unwrap()
            );
            let asked = subtrees_read_by(|r| inclusion_proof(new, old - 1, r).map(|_| ()));
            let map = SubtreeMap(
                asked
                    .iter()
                    .map(|&s| (s, tree.subtree_hashes(&[s]).unwrap()[0]))
                    .collect(),
            );
            assert_eq!(
                inclusion_proof(new, old - 1, &map).unwrap(),
                inclusion_proof(new, old - 1, &tree).unwrap()
            );
        }
    }

    #[test]
    fn edge_cases_are_refused() {
        let t = reference_tree(8);
        let r = h(ROOTS[8]);
        assert!(inclusion_proof(8, 8, &t).is_err());
        assert!(consistency_proof(5, 4, &t).is_err());
        assert!(tree_head(9, &t).is_err(), "a size the store does not hold");
        let leaf = leaf_hash(&[]);
        assert_eq!(
            verify_inclusion(leaf, 8, 8, &[], r),
            Err(ProofError::IndexOutOfRange { index: 8, size: 8 })
        );
        assert!(verify_consistency(5, 4, r, r, &[]).is_err());
        assert!(verify_consistency(0, 8, EMPTY_HASH, r, &[]).is_ok());
        assert!(verify_consistency(0, 8, EMPTY_HASH, r, &[r]).is_err());
        assert!(verify_consistency(0, 8, r, r, &[]).is_err());
        assert!(verify_consistency(3, 3, r, r, &[]).is_ok());
        assert!(verify_consistency(3, 3, r, h(ROOTS[3]), &[]).is_err());
        assert!(verify_consistency(3, 5, h(ROOTS[3]), h(ROOTS[5]), &[]).is_err());
        let long = vec![r; MAX_PROOF_HASHES + 1];
        assert!(matches!(
            verify_consistency(3, 5, r, r, &long),
            Err(ProofError::TooLong { .. })
        ));
    }

    struct Failing;
    impl SubtreeHashes for Failing {
        type Error = &'static str;
        fn subtree_hashes(&self, _: &[Subtree]) -> Result<Vec<Hash>, &'static str> {
            Err("disk on fire")
        }
    }

    #[test]
    fn store_errors_come_back_as_the_stores() {
        assert!(matches!(
            tree_head(5, &Failing),
            Err(TreeError::Store("disk on fire"))
        ));
        assert!(matches!(
            inclusion_proof(5, 2, &Failing),
            Err(TreeError::Store("disk on fire"))
        ));
        assert!(matches!(
            consistency_proof(3, 5, &Failing),
            Err(TreeError::Store("disk on fire"))
        ));
    }

    /// A tree of `n` leaves with distinct contents, and its root after every size.
    fn grown(n: u64) -> (MemoryTree, Vec<Hash>) {
        let mut t = MemoryTree::default();
        let mut roots = vec![t.root()];
        for i in 0..n {
            t.push(format!("event {i}").as_bytes());
            roots.push(t.root());
        }
        (t, roots)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Every inclusion proof of every leaf in random sizes verifies, agrees with
        /// tlog_tiles' own verifier, and fails once any byte of it, the leaf, the index, the
        /// size or the root is altered.
        #[test]
        fn every_inclusion_proof_verifies_and_any_change_fails(
            n in 1u64..300, pick in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let (t, roots) = grown(n);
            let root = roots[n as usize];
            for size in [n, 1 + pick.index(n as usize) as u64] {
                let root = roots[size as usize];
                for i in 0..size {
                    let leaf = leaf_hash(format!("event {i}").as_bytes());
                    let p = inclusion_proof(size, i, &t).unwrap();
                    prop_assert!(verify_inclusion(leaf, i, size, &p, root).is_ok());
                    prop_assert!(tlog_tiles::check_record(&p, size, root, i, leaf).is_ok());
                }
            }
            let i = pick.index(n as usize) as u64;
            let leaf = leaf_hash(format!("event {i}").as_bytes());
            let p = inclusion_proof(n, i, &t).unwrap();
            if !p.is_empty() {
                let mut bad = p.clone();
                let at = flip.index(p.len() * 32);
                bad[at / 32].0[at % 32] ^= 1 << bit;
                prop_assert!(verify_inclusion(leaf, i, n, &bad, root).is_err());
                let mut shorter = p.clone();
                shorter.pop();
                prop_assert!(verify_inclusion(leaf, i, n, &shorter, root).is_err());
            }
            let mut longer = p.clone();
            longer.push(root);
            prop_assert!(verify_inclusion(leaf, i, n, &longer, root).is_err());
            let mut other = leaf;
            other.0[flip.index(32)] ^= 1 << bit;
            prop_assert!(verify_inclusion(other, i, n, &p, root).is_err());
            if n > 1 {
                prop_assert!(verify_inclusion(leaf, (i + 1) % n, n, &p, root).is_err());
            }
            prop_assert!(verify_inclusion(leaf, i, n, &p, roots[n as usize - 1]).is_err());
        }

        /// Every consistency proof between random sizes verifies, agrees with tlog_tiles, and
        /// fails once any byte of it or either root is altered, or the sizes are swapped.
        #[test]
        fn every_consistency_proof_verifies_and_any_change_fails(
            n in 1u64..200, flip in any::<prop::sample::Index>(), bit in 0u8..8,
            a in any::<prop::sample::Index>(), b in any::<prop::sample::Index>(),
        ) {
            let (t, roots) = grown(n);
            for old in 0..=n {
                let p = consistency_proof(old, n, &t).unwrap();
                prop_assert!(verify_consistency(old, n, roots[old as usize], roots[n as usize], &p).is_ok(),
                    "{old} -> {n}");
                if old > 0 {
                    prop_assert!(tlog_tiles::check_tree(&p, n, roots[n as usize], old, roots[old as usize]).is_ok());
                }
            }
            let (mut old, mut new) = (a.index(n as usize + 1) as u64, b.index(n as usize + 1) as u64);
            if old > new {
                std::mem::swap(&mut old, &mut new);
            }
            let (ro, rn) = (roots[old as usize], roots[new as usize]);
            let p = consistency_proof(old, new, &t).unwrap();
            prop_assert!(verify_consistency(old, new, ro, rn, &p).is_ok());
            if !p.is_empty() {
                let mut bad = p.clone();
                let at = flip.index(p.len() * 32);
                bad[at / 32].0[at % 32] ^= 1 << bit;
                prop_assert!(verify_consistency(old, new, ro, rn, &bad).is_err());
                prop_assert!(verify_consistency(old, new, ro, rn, &p[..p.len() - 1]).is_err());
                prop_assert!(verify_consistency(new, old, rn, ro, &p).is_err());
            }
            let mut longer = p.clone();
            longer.push(rn);
            prop_assert!(verify_consistency(old, new, ro, rn, &longer).is_err());
            // Every tree extends the empty one: only then is the new root not bound.
            if old > 0 || new == 0 {
                let mut other = rn;
                other.0[flip.index(32)] ^= 1 << bit;
                prop_assert!(verify_consistency(old, new, ro, other, &p).is_err());
            }
            let mut other = ro;
            other.0[flip.index(32)] ^= 1 << bit;
            prop_assert!(verify_consistency(old, new, other, rn, &p).is_err());
        }
    }
}
