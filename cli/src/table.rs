//! Plain-text tables: one line per row, columns padded to their widest cell (the last column
//! is not padded), as kubectl prints them.

/// `headers`, then `rows` (each with as many cells as there are headers).
pub fn render<const N: usize>(headers: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths = headers.map(|h| h.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: [&str; N]| {
        for (i, cell) in cells.iter().enumerate() {
            out.push_str(cell);
            if i + 1 < N {
                let pad = widths[i] - cell.chars().count() + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    };
    line(*headers);
    for row in rows {
        line(row.each_ref().map(String::as_str));
    }
    out
}

/// A text on one line (a table has one row per item).
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_the_last_is_not_padded() {
        let rows = [
            ["a".to_string(), "long cell".to_string(), "x".to_string()],
            ["bbbb".to_string(), "-".to_string(), "y".to_string()],
        ];
        assert_eq!(
            render(&["K", "V", "LAST"], &rows),
            "K     V          LAST\na     long cell  x\nbbbb  -          y\n"
        );
        assert_eq!(one_line(" node n1\n is  NotReady "), "node n1 is NotReady");
    }
}
