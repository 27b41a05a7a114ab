//! exactl's one table printer (`status`, `link show`, `top`): columns as wide as their
//! widest cell and at least as wide as asked, numbers right-aligned, no trailing blanks.
//!
//! Hand-rolled rather than comfy-table or tabled: those draw bordered, padded cells, and
//! matching the plain `ps`-like layout operators, docs and tests rely on (single-space
//! gaps, a wider gap before a free-text column, minimum widths that keep the layout of a
//! quiet rack stable) takes as much configuration as this file has code.

/// One column: its header, alignment, least width and the blanks before it.
#[derive(Clone, Copy, Debug)]
pub struct Column {
    pub header: &'static str,
    pub right: bool,
    pub min: usize,
    /// Blanks between this column and the previous one.
    pub gap: usize,
}

impl Column {
    pub fn left(header: &'static str) -> Column {
        Column {
            header,
            right: false,
            min: 0,
            gap: 1,
        }
    }

    pub fn right(header: &'static str) -> Column {
        Column {
            right: true,
            ..Column::left(header)
        }
    }

    /// At least `min` characters wide, whatever the cells.
    pub fn min(self, min: usize) -> Column {
        Column { min, ..self }
    }

    pub fn gap(self, gap: usize) -> Column {
        Column { gap, ..self }
    }
}

/// A table of `columns`; rows shorter than the columns leave the rest blank.
#[derive(Clone, Debug)]
pub struct Table {
    columns: Vec<Column>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: Vec<Column>) -> Table {
        Table {
            columns,
            rows: Vec::new(),
        }
    }

    /// The same `gap` between every two columns.
    pub fn with_gap(mut self, gap: usize) -> Table {
        for c in &mut self.columns {
            c.gap = gap;
        }
        self
    }

    pub fn rows(mut self, rows: impl IntoIterator<Item = Vec<String>>) -> Table {
        self.rows.extend(rows);
        self
    }

    /// The header line and every row, each ending in a newline.
    pub fn render(&self) -> String {
        let widths: Vec<usize> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(i))
                    .map(|s| s.chars().count())
                    .chain([c.min, c.header.chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        let headers: Vec<&str> = self.columns.iter().map(|c| c.header).collect();
        self.line(&mut out, &widths, &headers);
        for r in &self.rows {
            let cells: Vec<&str> = r.iter().map(String::as_str).collect();
            self.line(&mut out, &widths, &cells);
        }
        out
    }

    fn line(&self, out: &mut String, widths: &[usize], cells: &[&str]) {
        let start = out.len();
        for (i, (c, w)) in self.columns.iter().zip(widths).enumerate() {
            if i > 0 {
                out.extend(std::iter::repeat_n(' ', c.gap));
            }
            let cell = cells.get(i).copied().unwrap_or("");
            let pad = w.saturating_sub(cell.chars().count());
            if c.right {
                out.extend(std::iter::repeat_n(' ', pad));
                out.push_str(cell);
            } else {
                out.push_str(cell);
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        let end = start + out[start..].trim_end().len();
        out.truncate(end);
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_fit_their_widest_cell_and_keep_their_least_width() {
        let t = Table::new(vec![
            Column::left("NAME").min(6),
            Column::right("N"),
            Column::left("NOTE").gap(2),
        ])
        .rows([
            vec!["a".into(), "12345".into(), "x".into()],
            vec!["longer-name".into(), "7".into()],
        ]);
        assert_eq!(
            t.render(),
            "NAME            N  NOTE\n\
             a           12345  x\n\
             longer-name     7\n"
        );
    }
}
