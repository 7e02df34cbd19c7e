//! What the policy's tests share: the packs its names are checked against.

use std::sync::OnceLock;

use crate::pack::{PackSet, Tool};

/// The stock packs, plus a pack with a risk:low write (no stock tool is low), a risk:high
/// write without a preview (every stock write has one) and a write whose param names a list
/// only the policy holds (`policy_allowlist: zones`).
pub(super) fn packs() -> &'static PackSet {
    static PACKS: OnceLock<PackSet> = OnceLock::new();
    PACKS.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("t.yaml"),
            "pack: t\ndescription: d\ntools:\n  low_write:\n    description: d\n    risk: low\n    scope: node\n    preview: {none: \"`true` changes nothing there is to show\"}\n    verify: {none: \"`true` changes nothing there is to check\"}\n    action: {exec: {argv: [\"true\"]}}\n  high_write:\n    description: d\n    risk: high\n    scope: node\n    preview: {none: \"`true` changes nothing there is to show\"}\n    verify: {none: \"`true` changes nothing there is to check\"}\n    action: {exec: {argv: [\"true\"]}}\n  port:\n    description: d\n    risk: read\n    scope: node\n    params: {port: {type: integer, allowlist: ports}}\n    action: {exec: {argv: [echo, \"{port}\"]}}\n  zone_write:\n    description: d\n    risk: high\n    scope: cluster\n    params: {zone: {type: identifier, policy_allowlist: zones}}\n    preview: {none: \"`true` changes nothing there is to show\"}\n    verify: {none: \"`true` changes nothing there is to check\"}\n    action: {exec: {argv: [\"true\", \"{zone}\"]}}\n",
        )
        .unwrap();
        PackSet::load(Some(dir.path())).unwrap()
    })
}

pub(super) fn tool(name: &str) -> &'static Tool {
    packs()
        .tool(name)
        .unwrap_or_else(|| panic!("no tool {name}"))
}
