//! A labelled heatmap on a pixel canvas: colmap, layout correlations, zero-column maps.
//!
//! Readability rules (issue 5 quality bar): cells stay square between 3 and 16 px, matrices
//! larger than `MAX_CELLS` per axis are pooled into blocks (said in the subtitle), axis labels
//! are thinned to power-of-two steps so neighbours never overlap, and a colour bar plus a
//! legend for the outlined cells, row classes and missing data sits on the right.

use super::{chart_err, font_px, FONT};
use crate::error::Result;
use crate::text::truncate;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Largest number of displayed rows or columns before pooling.
pub const MAX_CELLS: usize = 256;
const GRID_TARGET_W: f64 = 900.0;
const CELL_MAX: usize = 16;
const CELL_MIN: usize = 3;
const LABEL_PX: f64 = 11.0;
/// Minimum distance between label baselines so neighbours do not overlap.
const LABEL_PITCH: usize = 13;
const ROW_LABEL_CHARS: usize = 18;
const COL_LABEL_CHARS: usize = 16;
const CHAR_W: f64 = 6.6;
const LEGEND_W: i32 = 230;
const INK: RGBColor = RGBColor(40, 40, 40);

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    /// Values in [-1, 1] (cosines, correlations): blue - white - red; pooled by max.
    Diverging,
    /// Values in [0, 1] (fraction of zero columns): white - black; pooled by mean.
    Fraction,
}

/// Class of a row, drawn as a strip left of the grid (colmap clean / mixture / none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RowClass {
    Clean,
    None,
    Mixture,
}

pub struct Heatmap {
    pub title: String,
    pub notes: Vec<String>,
    /// `[rows][cols]`; NaN = no data.
    pub values: Vec<Vec<f64>>,
    /// Outlined cells (same shape as `values`).
    pub marked: Vec<Vec<bool>>,
    pub mark_label: Option<String>,
    pub row_labels: Vec<String>,
    pub col_labels: Vec<String>,
    pub row_class: Option<Vec<RowClass>>,
    pub x_title: String,
    pub y_title: String,
    pub scale: Scale,
    pub scale_label: String,
    pub nan_label: String,
    /// Square cells (colmap: a diagonal should look like one); otherwise rows are at least
    /// one label tall, so short matrices (a row per cache) get every row labelled.
    pub square: bool,
}

fn diverging(v: f64) -> RGBColor {
    // 20 steps a side: enough to read, and equal colours merge into one <rect> per run.
    let q = (v.clamp(-1.0, 1.0) * 20.0).round() / 20.0;
    let (end, t) = if q >= 0.0 {
        ((178.0, 24.0, 43.0), q)
    } else {
        ((33.0, 102.0, 172.0), -q)
    };
    let mix = |e: f64| (255.0 + (e - 255.0) * t).round() as u8;
    RGBColor(mix(end.0), mix(end.1), mix(end.2))
}

fn fraction(v: f64) -> RGBColor {
    let q = (v.clamp(0.0, 1.0) * 10.0).round() / 10.0;
    let g = (250.0 - 220.0 * q).round() as u8;
    RGBColor(g, g, g)
}

const NAN_DIVERGING: RGBColor = RGBColor(250, 235, 190);
const NAN_FRACTION: RGBColor = RGBColor(250, 235, 190);

fn class_color(c: RowClass) -> RGBColor {
    match c {
        RowClass::Clean => RGBColor(26, 152, 80),
        RowClass::Mixture => RGBColor(230, 145, 0),
        RowClass::None => RGBColor(170, 170, 170),
    }
}

impl Heatmap {
    fn color(&self, v: f64) -> RGBColor {
        match (v.is_nan(), self.scale) {
            (true, Scale::Diverging) => NAN_DIVERGING,
            (true, Scale::Fraction) => NAN_FRACTION,
            (false, Scale::Diverging) => diverging(v),
            (false, Scale::Fraction) => fraction(v),
        }
    }
}

/// Pooled view of the matrix: block sizes and the displayed values.
struct Pooled {
    br: usize,
    bc: usize,
    values: Vec<Vec<f64>>,
    marked: Vec<Vec<bool>>,
    class: Option<Vec<RowClass>>,
}

fn pool(h: &Heatmap) -> Pooled {
    let rows = h.values.len();
    let cols = h.values.iter().map(Vec::len).max().unwrap_or(0);
    let br = rows.div_ceil(MAX_CELLS).max(1);
    let bc = cols.div_ceil(MAX_CELLS).max(1);
    let (rd, cd) = (rows.div_ceil(br), cols.div_ceil(bc));
    let mut values = vec![vec![f64::NAN; cd]; rd];
    let mut marked = vec![vec![false; cd]; rd];
    for (i, vrow) in values.iter_mut().enumerate() {
        for (k, cell) in vrow.iter_mut().enumerate() {
            let mut acc: Vec<f64> = Vec::new();
            for r in i * br..((i + 1) * br).min(rows) {
                for c in k * bc..((k + 1) * bc).min(cols) {
                    if let Some(v) = h.values[r].get(c) {
                        if !v.is_nan() {
                            acc.push(*v);
                        }
                    }
                    if h.marked.get(r).and_then(|m| m.get(c)).copied() == Some(true) {
                        marked[i][k] = true;
                    }
                }
            }
            if !acc.is_empty() {
                *cell = match h.scale {
                    // Max keeps a one-cell diagonal visible inside a block.
                    Scale::Diverging => acc.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    Scale::Fraction => acc.iter().sum::<f64>() / acc.len() as f64,
                };
            }
        }
    }
    let class = h.row_class.as_ref().map(|cls| {
        (0..rd)
            .map(|i| {
                cls[i * br..((i + 1) * br).min(cls.len())]
                    .iter()
                    .copied()
                    .max()
                    .unwrap_or(RowClass::None)
            })
            .collect()
    });
    Pooled {
        br,
        bc,
        values,
        marked,
        class,
    }
}

/// Smallest power of two ≥ `min`: label steps that read as round numbers.
fn label_step(cell: usize) -> usize {
    let need = LABEL_PITCH.div_ceil(cell.max(1));
    need.next_power_of_two()
}

fn text_style(px: f64) -> TextStyle<'static> {
    TextStyle::from((FONT, font_px(px)).into_font()).color(&INK)
}

pub fn render(h: &Heatmap) -> Result<String> {
    if let Some(why) = empty_reason(h) {
        return Ok(empty_chart(&h.title, &why));
    }
    let p = pool(h);
    let rd = p.values.len();
    let cd = p.values.first().map(Vec::len).unwrap_or(0);
    let cell = ((GRID_TARGET_W / cd.max(1) as f64).floor() as usize).clamp(CELL_MIN, CELL_MAX);
    let row_h = if h.square {
        cell
    } else {
        cell.max(LABEL_PITCH + 1)
    };
    let row_chars = h
        .row_labels
        .iter()
        .map(|l| l.chars().count().min(ROW_LABEL_CHARS))
        .max()
        .unwrap_or(1);
    let col_chars = h
        .col_labels
        .iter()
        .map(|l| l.chars().count().min(COL_LABEL_CHARS))
        .max()
        .unwrap_or(1);
    let strip = if p.class.is_some() { 10 } else { 0 };
    let left = 34 + (row_chars as f64 * CHAR_W) as i32 + 12 + strip;
    let top = 40 + 17 * h.notes.len() as i32 + 8;
    let grid_w = (cd * cell) as i32;
    let grid_h = (rd * row_h) as i32;
    let bottom = (col_chars as f64 * CHAR_W) as i32 + 14 + 30;
    let legend_h = 330;
    let width = (left + grid_w + 30 + LEGEND_W).max(560);
    let height = (top + grid_h + bottom).max(top + legend_h);

    let mut buf = String::new();
    {
        let root =
            SVGBackend::with_string(&mut buf, (width as u32, height as u32)).into_drawing_area();
        draw(h, &p, &root, (cell, row_h), left, top, (width, height))?;
        root.present().map_err(chart_err("heatmap"))?;
    }
    Ok(buf)
}

#[allow(clippy::too_many_arguments)]
fn draw(
    h: &Heatmap,
    p: &Pooled,
    root: &DrawingArea<SVGBackend, Shift>,
    (cell, row_h): (usize, usize),
    left: i32,
    top: i32,
    (_width, height): (i32, i32),
) -> Result<()> {
    let err = chart_err("heatmap");
    root.fill(&WHITE).map_err(&err)?;
    root.draw(&Text::new(
        h.title.clone(),
        (10, 8),
        text_style(15.0).pos(Pos::new(HPos::Left, VPos::Top)),
    ))
    .map_err(&err)?;
    for (i, note) in h.notes.iter().enumerate() {
        root.draw(&Text::new(
            note.clone(),
            (10, 32 + 17 * i as i32),
            text_style(12.0).pos(Pos::new(HPos::Left, VPos::Top)),
        ))
        .map_err(&err)?;
    }
    draw_cells(h, p, root, (cell, row_h), (left, top))?;
    draw_labels(h, p, root, (cell, row_h), (left, top), height)?;
    let cd = p.values.first().map(Vec::len).unwrap_or(0);
    legend(h, p, root, left + cd as i32 * cell as i32 + 30, top)
}

/// The grid: cells, the marked outlines, the frame and the row-class strip.
fn draw_cells(
    h: &Heatmap,
    p: &Pooled,
    root: &DrawingArea<SVGBackend, Shift>,
    (cell, row_h): (usize, usize),
    (left, top): (i32, i32),
) -> Result<()> {
    let err = chart_err("heatmap");
    let c = cell as i32;
    let rh = row_h as i32;
    let rd = p.values.len();
    let cd = p.values.first().map(Vec::len).unwrap_or(0);
    // Cells: runs of one colour per row become one <rect> (keeps 2048-entry maps small).
    for (i, row) in p.values.iter().enumerate() {
        let y = top + i as i32 * rh;
        let mut k = 0;
        while k < row.len() {
            let color = h.color(row[k]);
            let mut end = k + 1;
            while end < row.len() && h.color(row[end]) == color {
                end += 1;
            }
            let x = left + k as i32 * c;
            root.draw(&Rectangle::new(
                [(x, y), (left + end as i32 * c, y + rh)],
                color.filled(),
            ))
            .map_err(&err)?;
            k = end;
        }
    }
    // Outlines over the cells: the expected map.
    // A 2 px outline would hide the value of a small cell.
    let stroke = if cell > 10 { 2 } else { 1 };
    for (i, row) in p.marked.iter().enumerate() {
        for (k, m) in row.iter().enumerate() {
            if *m {
                let (x, y) = (left + k as i32 * c, top + i as i32 * rh);
                root.draw(&Rectangle::new(
                    [(x, y), (x + c, y + rh)],
                    BLACK.stroke_width(stroke),
                ))
                .map_err(&err)?;
            }
        }
    }
    // Frame around the grid.
    root.draw(&Rectangle::new(
        [(left, top), (left + cd as i32 * c, top + rd as i32 * rh)],
        RGBColor(120, 120, 120).stroke_width(1),
    ))
    .map_err(&err)?;

    if let Some(classes) = &p.class {
        for (i, cl) in classes.iter().enumerate() {
            let y = top + i as i32 * rh;
            root.draw(&Rectangle::new(
                [(left - 9, y), (left - 3, y + rh)],
                class_color(*cl).filled(),
            ))
            .map_err(&err)?;
        }
    }
    Ok(())
}

/// Row and column labels (thinned) and the axis titles.
fn draw_labels(
    h: &Heatmap,
    p: &Pooled,
    root: &DrawingArea<SVGBackend, Shift>,
    (cell, row_h): (usize, usize),
    (left, top): (i32, i32),
    height: i32,
) -> Result<()> {
    let err = chart_err("heatmap");
    let c = cell as i32;
    let rh = row_h as i32;
    let rd = p.values.len();
    let cd = p.values.first().map(Vec::len).unwrap_or(0);
    // Row labels, thinned.
    let strip = if p.class.is_some() { 10 } else { 0 };
    let rstep = label_step(row_h);
    let lstyle = text_style(LABEL_PX);
    for i in (0..rd).step_by(rstep) {
        let label = h.row_labels.get(i * p.br).cloned().unwrap_or_default();
        root.draw(&Text::new(
            truncate(&label, ROW_LABEL_CHARS),
            (left - 8 - strip, top + i as i32 * rh + rh / 2),
            lstyle.pos(Pos::new(HPos::Right, VPos::Center)),
        ))
        .map_err(&err)?;
        tick(root, (left - strip - 1, top + i as i32 * rh + rh / 2), true)?;
    }
    // Column labels, thinned, rotated to read bottom-up below the grid.
    let cstep = label_step(cell);
    let grid_bottom = top + rd as i32 * rh;
    let vstyle = lstyle
        .transform(FontTransform::Rotate270)
        .pos(Pos::new(HPos::Right, VPos::Center));
    for k in (0..cd).step_by(cstep) {
        let label = h.col_labels.get(k * p.bc).cloned().unwrap_or_default();
        let x = left + k as i32 * c + c / 2;
        tick(root, (x, grid_bottom + 1), false)?;
        root.draw(&Text::new(
            truncate(&label, COL_LABEL_CHARS),
            (x, grid_bottom + 6),
            vstyle.clone(),
        ))
        .map_err(&err)?;
    }
    // Axis titles.
    let col_chars = h
        .col_labels
        .iter()
        .map(|l| l.chars().count().min(COL_LABEL_CHARS))
        .max()
        .unwrap_or(1);
    let xt_y = grid_bottom + 10 + (col_chars as f64 * CHAR_W) as i32 + 8;
    root.draw(&Text::new(
        h.x_title.clone(),
        (left + (cd as i32 * c) / 2, xt_y.min(height - 16)),
        text_style(12.5).pos(Pos::new(HPos::Center, VPos::Top)),
    ))
    .map_err(&err)?;
    root.draw(&Text::new(
        h.y_title.clone(),
        (14, top + (rd as i32 * rh) / 2),
        text_style(12.5)
            .transform(FontTransform::Rotate270)
            .pos(Pos::new(HPos::Center, VPos::Center)),
    ))
    .map_err(&err)?;
    Ok(())
}

fn tick(root: &DrawingArea<SVGBackend, Shift>, (x, y): (i32, i32), horizontal: bool) -> Result<()> {
    let to = if horizontal { (x - 3, y) } else { (x, y + 3) };
    root.draw(&PathElement::new(vec![(x, y), to], RGBColor(120, 120, 120)))
        .map_err(chart_err("heatmap"))?;
    Ok(())
}

fn legend(
    h: &Heatmap,
    p: &Pooled,
    root: &DrawingArea<SVGBackend, Shift>,
    x: i32,
    top: i32,
) -> Result<()> {
    let err = chart_err("heatmap");
    let small = text_style(11.0).pos(Pos::new(HPos::Left, VPos::Center));
    root.draw(&Text::new(
        h.scale_label.clone(),
        (x, top),
        text_style(11.5).pos(Pos::new(HPos::Left, VPos::Top)),
    ))
    .map_err(&err)?;
    let (bar_top, bar_h, steps) = (top + 20, 160, 40);
    let (lo, hi) = match h.scale {
        Scale::Diverging => (-1.0, 1.0),
        Scale::Fraction => (0.0, 1.0),
    };
    for s in 0..steps {
        let v = hi - (hi - lo) * (s as f64 + 0.5) / steps as f64;
        let y0 = bar_top + s * bar_h / steps;
        let y1 = bar_top + (s + 1) * bar_h / steps;
        root.draw(&Rectangle::new(
            [(x, y0), (x + 18, y1)],
            h.color(v).filled(),
        ))
        .map_err(&err)?;
    }
    root.draw(&Rectangle::new(
        [(x, bar_top), (x + 18, bar_top + bar_h)],
        RGBColor(120, 120, 120).stroke_width(1),
    ))
    .map_err(&err)?;
    let ticks: &[f64] = match h.scale {
        Scale::Diverging => &[1.0, 0.5, 0.0, -0.5, -1.0],
        Scale::Fraction => &[1.0, 0.5, 0.0],
    };
    for t in ticks {
        let y = bar_top + ((hi - t) / (hi - lo) * bar_h as f64).round() as i32;
        root.draw(&PathElement::new(vec![(x + 18, y), (x + 23, y)], INK))
            .map_err(&err)?;
        let label = match (h.scale, *t == 0.0) {
            (_, true) => "0".to_string(),
            (Scale::Diverging, false) => format!("{t:+.1}"),
            (Scale::Fraction, false) => format!("{t:.1}"),
        };
        root.draw(&Text::new(label, (x + 26, y), small.clone()))
            .map_err(&err)?;
    }

    let mut y = bar_top + bar_h + 22;
    let swatch = |root: &DrawingArea<SVGBackend, Shift>, y: i32, style: ShapeStyle, label: &str| {
        root.draw(&Rectangle::new([(x, y - 6), (x + 12, y + 6)], style))
            .map_err(chart_err("heatmap"))?;
        root.draw(&Text::new(label.to_string(), (x + 18, y), small.clone()))
            .map_err(chart_err("heatmap"))?;
        Ok::<(), crate::error::Error>(())
    };
    if let Some(label) = &h.mark_label {
        swatch(root, y, BLACK.stroke_width(2), label)?;
        y += 20;
    }
    let nan_color = h.color(f64::NAN);
    swatch(root, y, nan_color.filled(), &h.nan_label)?;
    y += 20;
    if p.class.is_some() {
        for (cl, label) in [
            (RowClass::Clean, "row strip: clean match"),
            (RowClass::Mixture, "row strip: mixture"),
            (RowClass::None, "row strip: no match"),
        ] {
            swatch(root, y, class_color(cl).filled(), label)?;
            y += 20;
        }
    }
    Ok(())
}

/// Why `h` would draw as a blank grid, in one sentence, or `None` when some cell shows: every
/// cell without data, or (a fraction map) every cell at 0 with none outlined, as a zero map
/// without a single always-zero column is.
fn empty_reason(h: &Heatmap) -> Option<String> {
    let cells = h.values.iter().map(Vec::len).sum::<usize>();
    let marked = h.marked.iter().flatten().any(|&m| m);
    if marked {
        return None;
    }
    let finite: Vec<f64> = h
        .values
        .iter()
        .flatten()
        .copied()
        .filter(|v| v.is_finite())
        .collect();
    if finite.is_empty() {
        return Some(format!(
            "Nothing to draw: none of the {cells} cells has a value ({}).",
            h.nan_label
        ));
    }
    if h.scale == Scale::Fraction && finite.iter().all(|&v| v == 0.0) {
        return Some(format!(
            "Nothing to draw: no cell is {} (all {} cells are 0), so the map would be blank.",
            h.scale_label,
            finite.len()
        ));
    }
    None
}

/// A chart that is its title and one sentence.
fn empty_chart(title: &str, why: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"720\" height=\"70\" viewBox=\"0 0 720 70\" role=\"img\" aria-label=\"{t}\">\
<text x=\"10\" y=\"24\" font-family=\"sans-serif\" font-size=\"15\" font-weight=\"bold\">{t}</text>\
<text x=\"10\" y=\"52\" font-family=\"sans-serif\" font-size=\"13\">{w}</text></svg>\n",
        t = crate::text::html(title),
        w = crate::text::html(why)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_steps_leave_room_for_a_label() {
        // 13 px pitch: a 9 px cell needs every 2nd label, a 3 px cell every 8th (5 → 8).
        assert_eq!(label_step(16), 1);
        assert_eq!(label_step(9), 2);
        assert_eq!(label_step(3), 8);
    }

    #[test]
    fn colour_scale_ends_and_middle() {
        assert_eq!(diverging(0.0), RGBColor(255, 255, 255));
        assert_eq!(diverging(1.0), RGBColor(178, 24, 43));
        assert_eq!(diverging(-1.0), RGBColor(33, 102, 172));
    }

    #[test]
    fn pooling_keeps_a_diagonal_and_its_marks() {
        let n = 600;
        let values: Vec<Vec<f64>> = (0..n)
            .map(|i| (0..n).map(|k| if i == k { 1.0 } else { 0.0 }).collect())
            .collect();
        let marked: Vec<Vec<bool>> = (0..n).map(|i| (0..n).map(|k| i == k).collect()).collect();
        let h = Heatmap {
            title: String::new(),
            notes: vec![],
            values,
            marked,
            mark_label: None,
            row_labels: vec![],
            col_labels: vec![],
            row_class: None,
            x_title: String::new(),
            y_title: String::new(),
            scale: Scale::Diverging,
            scale_label: String::new(),
            nan_label: String::new(),
            square: true,
        };
        let p = pool(&h);
        // 600 / 256 → blocks of 3, 200 displayed cells; the diagonal survives max-pooling.
        assert_eq!((p.br, p.bc, p.values.len()), (3, 3, 200));
        for i in 0..200 {
            assert_eq!(p.values[i][i], 1.0);
            assert!(p.marked[i][i]);
        }
        assert_eq!(p.values[0][5], 0.0);
    }
}
