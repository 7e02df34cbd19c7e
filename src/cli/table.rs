//! The one table printer of the list commands (`emisar token list`, `user list`,
//! `join-token list`, `runner list`): a heading line, then one line per row.
//!
//! Invariant: every column but the last is padded to its width (text to the left, counts to
//! the right) and never cut, columns are two spaces apart, and the last column is printed
//! as it is, so a line has no trailing blanks.

/// How one column is laid out.
#[derive(Debug, Clone, Copy)]
pub(super) enum Col {
    /// Text, padded on the right to this width.
    Left(usize),
    /// A count, padded on the left to this width.
    Right(usize),
    /// The last column: never padded.
    Last,
}

/// One line of a table: `cells` laid out by `cols`.
pub(super) fn line<const N: usize>(cols: &[Col; N], cells: [&str; N]) -> String {
    cols.iter()
        .zip(cells)
        .map(|(col, cell)| match *col {
            Col::Left(width) => format!("{cell:<width$}"),
            Col::Right(width) => format!("{cell:>width$}"),
            Col::Last => cell.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("  ")
}

/// Prints one line of a table (the heading is a line like any other).
pub(super) fn print<const N: usize>(cols: &[Col; N], cells: [&str; N]) {
    println!("{}", line(cols, cells));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_padded_not_cut_and_the_last_is_left_alone() {
        let cols = [Col::Left(4), Col::Right(5), Col::Last];
        assert_eq!(line(&cols, ["ID", "USES", "STATE"]), "ID     USES  STATE");
        assert_eq!(line(&cols, ["longer", "1/2", "ok"]), "longer    1/2  ok");
        assert_eq!(
            line(&cols, ["a", "b", "c"]),
            format!("{:<4}  {:>5}  {}", "a", "b", "c")
        );
        // The join-token list, as its format string printed it before this printer.
        let cols = [
            Col::Left(36),
            Col::Left(27),
            Col::Left(27),
            Col::Right(11),
            Col::Left(24),
            Col::Left(24),
            Col::Last,
        ];
        let row = [
            "0b7e1c2a-5d4f-4e3b-9a8c-1f2e3d4c5b6a",
            "2026-12-01T22:00:00.000000Z",
            "2026-12-02T22:00:00.000000Z",
            "1/5",
            "edge-*",
            "a label text longer than its column",
            "active",
        ];
        assert_eq!(
            line(&cols, row),
            format!(
                "{:<36}  {:<27}  {:<27}  {:>11}  {:<24}  {:<24}  {}",
                row[0], row[1], row[2], row[3], row[4], row[5], row[6]
            )
        );
    }
}
