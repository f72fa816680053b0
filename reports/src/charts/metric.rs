//! Per-step / per-position metric chart: cosine line on top, top-1 agreement strip below.

use super::{chart_err, font_px, FONT};
use crate::error::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

pub struct MetricChart {
    pub title: String,
    pub x_desc: String,
    pub xs: Vec<f64>,
    pub cosine: Vec<f64>,
    pub top1: Vec<bool>,
    /// A vertical marker (e.g. the first divergence) with its legend text.
    pub marker: Option<(f64, String)>,
}

const WIDTH: u32 = 900;
const HEIGHT: u32 = 380;
const BLUE_LINE: RGBColor = RGBColor(33, 102, 172);
const GOOD: RGBColor = RGBColor(26, 152, 80);
const BAD: RGBColor = RGBColor(200, 30, 40);

/// y range: down to 0.8 at least so healthy INT8 noise (0.96-0.99) is visible, lower if needed.
fn y_range(cos: &[f64]) -> (f64, f64) {
    let min = cos
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(f64::INFINITY, f64::min);
    let lo = if min.is_finite() {
        ((min - 0.05) * 10.0).floor() / 10.0
    } else {
        0.0
    };
    (lo.clamp(-1.0, 0.8), 1.02)
}

pub fn render(m: &MetricChart) -> Result<String> {
    let err = chart_err("metric");
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let (upper, lower) = root.split_vertically(280);
        let (x0, x1) = match (
            m.xs.iter().copied().reduce(f64::min),
            m.xs.iter().copied().reduce(f64::max),
        ) {
            (Some(a), Some(b)) => (a - 0.5, b + 0.5),
            _ => (0.0, 1.0),
        };
        let legend = header(m, &upper)?;
        cosine_plot(m, &upper, (x0, x1), legend)?;
        top1_strip(m, &lower, (x0, x1))?;
        root.present().map_err(&err)?;
    }
    Ok(buf)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Title left, legend right; returns the number of legend lines.
fn header(m: &MetricChart, upper: &Area) -> Result<usize> {
    let err = chart_err("metric");
    // Title left, legend right, both above the plot: a legend inside would hide points.
    upper
        .draw(&Text::new(
            m.title.clone(),
            (12, 8),
            TextStyle::from((FONT, font_px(14.0)).into_font())
                .color(&RGBColor(40, 40, 40))
                .pos(Pos::new(HPos::Left, VPos::Top)),
        ))
        .map_err(&err)?;
    let mut legend: Vec<(String, RGBColor)> =
        vec![("cosine, device vs reference".to_string(), BLUE_LINE)];
    if let Some((_, label)) = &m.marker {
        legend.push((label.clone(), BAD));
    }
    let small = TextStyle::from((FONT, font_px(11.0)).into_font())
        .color(&RGBColor(40, 40, 40))
        .pos(Pos::new(HPos::Left, VPos::Center));
    for (i, (label, color)) in legend.iter().enumerate() {
        let x = WIDTH as i32 - 250;
        let y = 12 + 16 * i as i32;
        upper
            .draw(&PathElement::new(
                vec![(x, y), (x + 20, y)],
                color.stroke_width(2),
            ))
            .map_err(&err)?;
        upper
            .draw(&Text::new(label.clone(), (x + 26, y), small.clone()))
            .map_err(&err)?;
    }
    Ok(legend.len())
}

/// Cosine per x, with the marker line.
fn cosine_plot(m: &MetricChart, upper: &Area, (x0, x1): (f64, f64), legend: usize) -> Result<()> {
    let err = chart_err("metric");
    let (y0, y1) = y_range(&m.cosine);
    let mut chart = ChartBuilder::on(upper)
        .margin(10)
        .margin_top(16 + 16 * legend as u32)
        .x_label_area_size(0)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(&err)?;
    chart
        .configure_mesh()
        .y_desc("cosine")
        .x_labels(0)
        .label_style((FONT, font_px(11.0)))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(&err)?;
    let pts: Vec<(f64, f64)> =
        m.xs.iter()
            .zip(&m.cosine)
            .filter(|(_, y)| y.is_finite())
            .map(|(x, y)| (*x, y.clamp(y0, y1)))
            .collect();
    chart
        .draw_series(std::iter::once(PathElement::new(
            pts.clone(),
            BLUE_LINE.stroke_width(2),
        )))
        .map_err(&err)?;
    chart
        .draw_series(pts.iter().map(|p| Circle::new(*p, 3, BLUE_LINE.filled())))
        .map_err(&err)?;
    if let Some((mx, _)) = &m.marker {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(*mx, y0), (*mx, y1)],
                BAD.stroke_width(1),
            )))
            .map_err(&err)?;
    }
    Ok(())
}

/// Top-1 match per x, as a strip of dots under the plot.
fn top1_strip(m: &MetricChart, lower: &Area, (x0, x1): (f64, f64)) -> Result<()> {
    let err = chart_err("metric");
    let mut strip = ChartBuilder::on(lower)
        .margin_left(10)
        .margin_right(10)
        .margin_bottom(6)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, -0.5f64..1.5f64)
        .map_err(&err)?;
    strip
        .configure_mesh()
        .x_desc(m.x_desc.clone())
        .y_desc("top-1")
        .y_labels(3)
        .y_label_formatter(&|v| match v.round() as i64 {
            1 => "match".to_string(),
            0 => "differs".to_string(),
            _ => String::new(),
        })
        // plotters may put ticks between integer steps; label integers only.
        .x_label_formatter(&|v| {
            if (v - v.round()).abs() < 1e-9 {
                format!("{v:.0}")
            } else {
                String::new()
            }
        })
        .label_style((FONT, font_px(11.0)))
        .disable_y_mesh()
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(&err)?;
    strip
        .draw_series(m.xs.iter().zip(&m.top1).map(|(x, ok)| {
            let style = if *ok { GOOD.filled() } else { BAD.filled() };
            Circle::new((*x, if *ok { 1.0 } else { 0.0 }), 4, style)
        }))
        .map_err(&err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::y_range;

    #[test]
    fn y_range_shows_int8_noise_and_deep_drops() {
        assert_eq!(y_range(&[0.97, 0.99]), (0.8, 1.02));
        assert_eq!(y_range(&[0.31, 0.99]), (0.2, 1.02));
        assert_eq!(y_range(&[f64::NAN]), (0.0, 1.02));
    }
}
