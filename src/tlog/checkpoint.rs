//! C2SP `tlog-checkpoint` as a `signed-note`: the text (origin, tree size, base64 root hash,
//! optional extension lines) is `tlog_tiles`' `Checkpoint`, the signatures `signed_note`'s.
//! Signing, parsing, and verifying against the keys a reader trusts for that origin.

use signed_note::{Note, NoteError};
pub use tlog_tiles::Checkpoint;

use super::keys::{NoteKey, Verifiers};
use super::tree::Hash;

/// Why a signed checkpoint was refused.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(
        "the note is malformed (signed-note: UTF-8, no control characters but newline, at most \
         1 MB, text then a blank line then 1 to 100 signature lines `— name base64`)"
    )]
    MalformedNote,
    #[error(
        "the checkpoint text is malformed (tlog-checkpoint: origin line, decimal size without \
         leading zeros, base64 root hash, then optional non-empty extension lines)"
    )]
    MalformedCheckpoint,
    #[error("no signature by a trusted key for this origin")]
    Unsigned,
    #[error("a signature by trusted key {0} does not verify")]
    BadSignature(String),
    #[error("failed to sign the checkpoint: {0}")]
    Signing(String),
}

/// The signed note of a checkpoint, signed by `key` (the log's key).
pub fn sign(
    origin: &str,
    size: u64,
    root: Hash,
    extension: &str,
    key: &NoteKey,
) -> Result<Vec<u8>, CheckpointError> {
    let text = Checkpoint::new(origin, size, root, extension)
        .map_err(|_| CheckpointError::MalformedCheckpoint)?
        .to_bytes();
    if origin.contains('\n') {
        return Err(CheckpointError::MalformedCheckpoint);
    }
    let mut note = Note::new(&text, &[]).map_err(|_| CheckpointError::MalformedNote)?;
    note.add_sigs(&[&key.signer()])
        .map_err(|e| CheckpointError::Signing(e.to_string()))?;
    Ok(note.to_bytes())
}

/// Parses a signed checkpoint without verifying it: the caller first learns the origin, then
/// verifies with [`verify`] against that origin's keys. The checkpoint is not to be trusted
/// before that.
pub fn parse(bytes: &[u8]) -> Result<(Note, Checkpoint), CheckpointError> {
    let note = Note::from_bytes(bytes).map_err(|_| CheckpointError::MalformedNote)?;
    let checkpoint =
        Checkpoint::from_bytes(note.text()).map_err(|_| CheckpointError::MalformedCheckpoint)?;
    Ok((note, checkpoint))
}

/// Verifies that at least one of `keys` signed `note`; signatures of other keys (other
/// witnesses' cosignatures, say) are ignored, a bad signature of a trusted key is refused.
pub fn verify(note: &Note, keys: &Verifiers) -> Result<(), CheckpointError> {
    match note.verify(keys) {
        Ok(_) => Ok(()),
        Err(NoteError::InvalidSignature { name, id }) => {
            Err(CheckpointError::BadSignature(format!("{name}+{id:08x}")))
        }
        Err(_) => Err(CheckpointError::Unsigned),
    }
}

/// The names of the witnesses in `witnesses` (each its name and its cosignature key) whose
/// signature on `note` verifies, in their order: each counts once, however many lines it
/// signed, and a line by any other key is ignored. What a reader compares with its quorum.
pub fn cosigned_by<'a>(note: &Note, witnesses: &'a [(String, Verifiers)]) -> Vec<&'a str> {
    witnesses
        .iter()
        .filter(|(_, keys)| verify(note, keys).is_ok())
        .map(|(name, _)| name.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tlog::tree::record_hash;

    /// Go's sumdb/tlog `TestFormatTree` (and tlog_tiles' own): the golden checkpoint text.
    #[test]
    fn go_tlog_format_tree_vector() {
        let c = Checkpoint::new(
            "go.sum database tree",
            123456789012,
            record_hash(b"hello world"),
            "",
        )
        .unwrap();
        assert_eq!(
            c.to_bytes(),
            b"go.sum database tree\n123456789012\nTszzRgjTG6xce+z2AG31kAXYKBgQVtCSCE40HmuwBb0=\n"
        );
    }

    #[test]
    fn sign_parse_verify() {
        let log = NoteKey::from_seed("log.example/audit", [1; 32]).unwrap();
        let other = NoteKey::from_seed("log.example/audit", [2; 32]).unwrap();
        let root = record_hash(b"x");
        let signed = sign("log.example/audit", 7, root, "ext line\n", &log).unwrap();
        let (note, cp) = parse(&signed).unwrap();
        assert_eq!(
            (cp.origin(), cp.size(), *cp.hash()),
            ("log.example/audit", 7, root)
        );
        assert_eq!(cp.extension(), "ext line\n");
        verify(
            &note,
            &Verifiers::parse([log.verifier_key().as_str()]).unwrap(),
        )
        .unwrap();
        assert!(matches!(
            verify(
                &note,
                &Verifiers::parse([other.verifier_key().as_str()]).unwrap()
            ),
            Err(CheckpointError::Unsigned)
        ));
        // A signature that claims the trusted key but does not verify.
        let text = String::from_utf8(signed.clone())
            .unwrap()
            .replace("\n7\n", "\n8\n");
        let (note, _) = parse(text.as_bytes()).unwrap();
        assert!(matches!(
            verify(
                &note,
                &Verifiers::parse([log.verifier_key().as_str()]).unwrap()
            ),
            Err(CheckpointError::BadSignature(_))
        ));
    }

    #[test]
    fn cosigned_by_names_each_trusted_witness_whose_cosignature_verifies_once() {
        let log = NoteKey::from_seed("log.example/audit", [1; 32]).unwrap();
        let w1 = NoteKey::from_seed("witness.example/w1", [2; 32]).unwrap();
        let w2 = NoteKey::from_seed("witness.example/w2", [3; 32]).unwrap();
        let w3 = NoteKey::from_seed("witness.example/w3", [4; 32]).unwrap();
        let stranger = NoteKey::from_seed("witness.example/w2", [5; 32]).unwrap();
        let signed = sign("log.example/audit", 7, record_hash(b"x"), "", &log).unwrap();
        let (mut note, _) = parse(&signed).unwrap();
        note.add_sigs(&[&w1.cosigner(), &w2.cosigner(), &stranger.cosigner()])
            .unwrap();
        let trusted: Vec<(String, Verifiers)> = [&w1, &w2, &w3]
            .iter()
            .map(|w| {
                let key = w.cosigner_key();
                (
                    w.name().to_owned(),
                    Verifiers::parse([key.as_str()]).unwrap(),
                )
            })
            .collect();
        assert_eq!(
            cosigned_by(&note, &trusted),
            ["witness.example/w1", "witness.example/w2"]
        );
        // The log key's own signature is no cosignature.
        let (bare, _) = parse(&signed).unwrap();
        assert!(cosigned_by(&bare, &trusted).is_empty());
        // A trusted witness's line over another checkpoint does not count.
        let other = sign("log.example/audit", 8, record_hash(b"x"), "", &log).unwrap();
        let (mut other, _) = parse(&other).unwrap();
        other.add_sigs(&[&w1.cosigner()]).unwrap();
        let line = String::from_utf8(other.to_bytes()).unwrap();
        let line = line.lines().last().unwrap();
        let moved = format!("{}{line}\n", String::from_utf8(signed).unwrap());
        let (moved, _) = parse(moved.as_bytes()).unwrap();
        assert!(cosigned_by(&moved, &trusted).is_empty());
    }

    #[test]
    fn malformed_checkpoints_are_refused() {
        let log = NoteKey::from_seed("log.example/audit", [1; 32]).unwrap();
        let sig = {
            let s = String::from_utf8(sign("o", 1, record_hash(b"x"), "", &log).unwrap()).unwrap();
            s[s.find("\n\n").unwrap()..].to_owned()
        };
        let root = record_hash(b"x").to_string();
        for text in [
            format!("o\n007\n{root}"),
            format!("o\n-1\n{root}"),
            "o\n7\nnot-base64".to_owned(),
            "o\n7".to_owned(),
            format!("\n7\n{root}"),
            format!("o\n7\n{root}\n\nx"),
        ] {
            let note = format!("{text}{sig}");
            assert!(parse(note.as_bytes()).is_err(), "{text:?}");
        }
        assert!(matches!(
            parse(b"no signatures\n"),
            Err(CheckpointError::MalformedNote)
        ));
        assert!(matches!(
            parse("o\n1\nx\x07\n\n— o AAAAAAA=\n".as_bytes()),
            Err(CheckpointError::MalformedNote)
        ));
        assert!(parse(&[0xff, b'\n', b'\n']).is_err());
        let too_many = format!("o\n1\n{root}\n\n{}", "— o AAAAAAAA\n".repeat(101));
        assert!(matches!(
            parse(too_many.as_bytes()),
            Err(CheckpointError::MalformedNote)
        ));
    }
}
