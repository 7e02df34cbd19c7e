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
    }
}
