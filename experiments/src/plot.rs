//! Plots (plotters): line charts, grids of line charts and grouped bar charts, each written as
//! PNG and SVG with a provenance footer. Text uses the DejaVu Sans file in `assets/`, compiled
//! into the binary and registered with plotters' ab_glyph backend, so no system font is needed.

use crate::provenance::Provenance;
use anyhow::{anyhow, bail, ensure, Context, Result};
use cadence::io::output::{OutputPath, Overwrite};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// DejaVu Sans 2.37 (Debian fonts-dejavu-core); license in assets/DejaVuSans-LICENSE.txt.
pub static FONT_BYTES: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const FONT: &str = "sans-serif";

/// Registers the bundled font as plotters' "sans-serif" (once per process).
pub fn ensure_font() -> Result<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok());
    ensure!(ok, "the bundled font assets/DejaVuSans.ttf could not be parsed");
    Ok(())
}

/// Categorical colours (Tableau 10).
pub const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Scale {
    #[default]
    Linear,
    /// Base-10 logarithmic; points with a value <= 0 on this axis are left out.
    Log,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LineStyle {
    #[default]
    Solid,
    Dashed,
    /// Markers only, no line.
    Markers,
    /// Line with a marker at every point.
    SolidMarkers,
}

#[derive(Clone, Debug, Default)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub style: LineStyle,
    /// Index into [`PALETTE`] (wraps); None: the series' position in the chart.
    pub color: Option<usize>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series { name: name.into(), points, ..Default::default() }
    }
    pub fn style(mut self, style: LineStyle) -> Self {
        self.style = style;
        self
    }
    pub fn color(mut self, idx: usize) -> Self {
        self.color = Some(idx);
        self
    }
}

/// Where the legend box goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Legend {
    #[default]
    UpperRight,
    UpperLeft,
    LowerLeft,
    LowerRight,
    MiddleRight,
}

impl Legend {
    fn position(self) -> SeriesLabelPosition {
        match self {
            Legend::UpperRight => SeriesLabelPosition::UpperRight,
            Legend::UpperLeft => SeriesLabelPosition::UpperLeft,
            Legend::LowerLeft => SeriesLabelPosition::LowerLeft,
            Legend::LowerRight => SeriesLabelPosition::LowerRight,
            Legend::MiddleRight => SeriesLabelPosition::MiddleRight,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_scale: Scale,
    pub y_scale: Scale,
    /// Axis ranges; None: from the data (with a margin).
    pub x_range: Option<(f64, f64)>,
    pub y_range: Option<(f64, f64)>,
    pub series: Vec<Series>,
    pub legend: Legend,
}

impl LineChart {
    pub fn new(title: impl Into<String>, x_label: impl Into<String>, y_label: impl Into<String>) -> Self {
        LineChart { title: title.into(), x_label: x_label.into(), y_label: y_label.into(), ..Default::default() }
    }
    pub fn series(mut self, s: Series) -> Self {
        self.series.push(s);
        self
    }
    pub fn log_x(mut self) -> Self {
        self.x_scale = Scale::Log;
        self
    }
    pub fn log_y(mut self) -> Self {
        self.y_scale = Scale::Log;
        self
    }
    pub fn x_range(mut self, lo: f64, hi: f64) -> Self {
        self.x_range = Some((lo, hi));
        self
    }
    pub fn y_range(mut self, lo: f64, hi: f64) -> Self {
        self.y_range = Some((lo, hi));
        self
    }
    pub fn legend(mut self, at: Legend) -> Self {
        self.legend = at;
        self
    }
}

/// Grouped bars: one group per category, one bar per series within each group.
#[derive(Clone, Debug, Default)]
pub struct BarChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub categories: Vec<String>,
    /// (name, one value per category).
    pub series: Vec<(String, Vec<f64>)>,
    /// Print each bar's value above it.
    pub value_labels: bool,
}

/// The two files a plot call writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlotFiles {
    pub png: PathBuf,
    pub svg: PathBuf,
}

const FOOTER_H: u32 = 44;
const TITLE_H: u32 = 40;

/// One line chart, written to `<base>.png` and `<base>.svg` (1200 x 800 pixels).
pub fn line_plot(base: &Path, chart: &LineChart, prov: &Provenance) -> Result<PlotFiles> {
    validate_line(chart)?;
    render(base, (1200, 800), prov, &OneLine(chart))
}

/// Several line charts on one figure, `cols` per row, under a common title.
pub fn line_plot_grid(
    base: &Path,
    title: &str,
    charts: &[LineChart],
    cols: usize,
    prov: &Provenance,
) -> Result<PlotFiles> {
    ensure!(!charts.is_empty() && cols > 0, "a plot grid needs at least one chart and one column");
    for c in charts {
        validate_line(c)?;
    }
    let cols = cols.min(charts.len());
    let rows = charts.len().div_ceil(cols);
    let size = ((cols as u32 * 620).max(900), rows as u32 * 440 + TITLE_H + FOOTER_H);
    render(base, size, prov, &Grid { title, charts, rows, cols })
}

/// A grouped bar chart, written to `<base>.png` and `<base>.svg` (1200 x 800 pixels).
pub fn bar_plot(base: &Path, chart: &BarChart, prov: &Provenance) -> Result<PlotFiles> {
    ensure!(!chart.categories.is_empty(), "bar chart '{}' has no categories", chart.title);
    ensure!(!chart.series.is_empty(), "bar chart '{}' has no series", chart.title);
    for (name, v) in &chart.series {
        ensure!(
            v.len() == chart.categories.len(),
            "bar chart '{}': series '{name}' has {} values for {} categories",
            chart.title,
            v.len(),
            chart.categories.len()
        );
        ensure!(v.iter().all(|x| x.is_finite()), "bar chart '{}': series '{name}' has a non-finite value", chart.title);
    }
    render(base, (1200, 800), prov, &Bars(chart))
}

/// A timeline: a row of categorical spans (e.g. phoneme classes), rows of tick marks (e.g. the
/// keyframes of several schedules) and a line chart below, on one x axis.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub title: String,
    /// Name of the span row, and the names of its categories (legend, colours in order).
    pub span_row: String,
    pub categories: Vec<String>,
    /// (x0, x1, category index).
    pub spans: Vec<(f64, f64, usize)>,
    /// (row name, tick positions, colour index into [`PALETTE`]).
    pub ticks: Vec<(String, Vec<f64>, usize)>,
    /// Drawn below; its x range is the timeline's.
    pub chart: LineChart,
    pub x_range: (f64, f64),
}

/// A [`Timeline`] written to `<base>.png` and `<base>.svg` (1600 pixels wide).
pub fn timeline_plot(base: &Path, t: &Timeline, prov: &Provenance) -> Result<PlotFiles> {
    ensure!(t.x_range.0 < t.x_range.1, "timeline '{}': empty x range {:?}", t.title, t.x_range);
    ensure!(t.spans.iter().all(|s| s.2 < t.categories.len()), "timeline '{}': a span has no category", t.title);
    validate_line(&t.chart)?;
    let rows = 1 + t.ticks.len() as u32;
    render(base, (1600, 260 + 34 * rows + 420 + TITLE_H + FOOTER_H), prov, &TimelineFig(t))
}

struct TimelineFig<'a>(&'a Timeline);
impl Figure for TimelineFig<'_> {
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        let t = self.0;
        let err = |e: &dyn std::fmt::Display| anyhow!("timeline '{}': {e}", t.title);
        let area = area.titled(&t.title, (FONT, 22)).map_err(|e| err(&e))?;
        let rows = 1 + t.ticks.len();
        let (_, h) = area.dim_in_pixel();
        let (top, bottom) = area.split_vertically(h.saturating_sub(440).max(120));
        let names: Vec<String> =
            std::iter::once(t.span_row.clone()).chain(t.ticks.iter().map(|r| r.0.clone())).collect();
        // The categories' legend: one line of colour boxes above the rows.
        let style = TextStyle::from((FONT, 13).into_font());
        for (ci, name) in t.categories.iter().enumerate() {
            let x = 170 + 170 * ci as i32;
            let color = PALETTE[ci % PALETTE.len()];
            top.draw(&Rectangle::new([(x, 10), (x + 14, 24)], color.filled())).map_err(|e| err(&e))?;
            top.draw(&Text::new(name.clone(), (x + 20, 10), style.clone())).map_err(|e| err(&e))?;
        }
        let mut chart = ChartBuilder::on(&top)
            .margin(12)
            .margin_top(36)
            .x_label_area_size(28)
            .y_label_area_size(150)
            .build_cartesian_2d(t.x_range.0..t.x_range.1, 0f64..rows as f64)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(rows * 2 + 1)
            .y_label_formatter(&|v| {
                // Row i (from the top) occupies [rows - i - 1, rows - i); label its centre only.
                let i = rows as f64 - v - 0.5;
                if (i - i.round()).abs() < 1e-6 && i >= -0.5 && (i.round() as usize) < rows {
                    names[i.round() as usize].clone()
                } else {
                    String::new()
                }
            })
            .x_label_formatter(&|v| fmt_tick(*v))
            .label_style((FONT, 13))
            .light_line_style(RGBColor(245, 245, 245))
            .bold_line_style(RGBColor(225, 225, 225))
            .draw()
            .map_err(|e| err(&e))?;
        let y_top = rows as f64;
        for ci in 0..t.categories.len() {
            let color = PALETTE[ci % PALETTE.len()];
            chart
                .draw_series(
                    t.spans
                        .iter()
                        .filter(|s| s.2 == ci)
                        .map(|&(x0, x1, _)| Rectangle::new([(x0, y_top - 0.9), (x1, y_top - 0.1)], color.filled())),
                )
                .map_err(|e| err(&e))?;
        }
        for (i, (_, xs, c)) in t.ticks.iter().enumerate() {
            let color = PALETTE[c % PALETTE.len()];
            let y = y_top - 1.0 - i as f64;
            chart
                .draw_series(
                    xs.iter().map(|&x| PathElement::new(vec![(x, y - 0.85), (x, y - 0.15)], color.stroke_width(1))),
                )
                .map_err(|e| err(&e))?;
        }
        let mut below = t.chart.clone();
        below.x_range = Some(t.x_range);
        draw_line_chart(&bottom, &below, 17)
    }
}

/// Something drawn the same way into the PNG and the SVG backend.
trait Figure {
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()>;
}

struct OneLine<'a>(&'a LineChart);
impl Figure for OneLine<'_> {
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        draw_line_chart(area, self.0, 22)
    }
}

struct Grid<'a> {
    title: &'a str,
    charts: &'a [LineChart],
    rows: usize,
    cols: usize,
}
impl Figure for Grid<'_> {
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        let area = area.titled(self.title, (FONT, 24)).map_err(|e| anyhow!("{e}"))?;
        let cells = area.split_evenly((self.rows, self.cols));
        for (cell, chart) in cells.iter().zip(self.charts) {
            draw_line_chart(cell, chart, 17)?;
        }
        Ok(())
    }
}

struct Bars<'a>(&'a BarChart);
impl Figure for Bars<'_> {
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        draw_bar_chart(area, self.0)
    }
}

fn validate_line(chart: &LineChart) -> Result<()> {
    ensure!(!chart.series.is_empty(), "chart '{}' has no series", chart.title);
    let usable = chart.series.iter().flat_map(|s| &s.points).filter(|p| usable_point(chart, **p)).count();
    ensure!(usable > 0, "chart '{}' has no finite point to draw (log axes drop values <= 0)", chart.title);
    Ok(())
}

fn usable_point(chart: &LineChart, (x, y): (f64, f64)) -> bool {
    x.is_finite()
        && y.is_finite()
        && (chart.x_scale == Scale::Linear || x > 0.0)
        && (chart.y_scale == Scale::Linear || y > 0.0)
}

/// Draws `fig` into a PNG and an SVG; both are written beside their targets and renamed,
/// so a failure leaves no half-written plot.
fn render<F: Figure>(base: &Path, size: (u32, u32), prov: &Provenance, fig: &F) -> Result<PlotFiles> {
    ensure_font()?;
    let png = with_ext(base, "png");
    let svg = with_ext(base, "svg");
    // The SVG is drawn into memory first, so a drawing error leaves no file at all.
    let mut text = String::new();
    draw_page(SVGBackend::with_string(&mut text, size).into_drawing_area(), prov, fig)
        .with_context(|| format!("drawing {}", svg.display()))?;
    let png_out = OutputPath::check(&png, Overwrite::Replace, &[])?;
    let partial = png_out.begin()?;
    draw_page(BitMapBackend::new(partial.path(), size).into_drawing_area(), prov, fig)
        .with_context(|| format!("drawing {}", png.display()))?;
    partial.commit()?;
    cadence::io::output::write_atomically(&svg, |w| {
        use std::io::Write;
        w.write_all(text.as_bytes())?;
        Ok(())
    })?;
    Ok(PlotFiles { png, svg })
}

/// White page, the figure, and the provenance footer.
fn draw_page<DB: DrawingBackend, F: Figure>(area: DrawingArea<DB, Shift>, prov: &Provenance, fig: &F) -> Result<()> {
    area.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let (w, h) = area.dim_in_pixel();
    let (main, foot) = area.split_vertically(h - FOOTER_H);
    fig.draw(&main)?;
    let style = TextStyle::from((FONT, 12).into_font()).color(&RGBColor(90, 90, 90));
    for (i, l) in prov.footer_lines().iter().enumerate() {
        foot.draw_text(&fit(l, w as usize, 6.6), &style, (8, 6 + 18 * i as i32)).map_err(|e| anyhow!("{e}"))?;
    }
    area.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// Shortens a footer line that would run past `width` pixels (about `px_per_char` each).
fn fit(s: &str, width: usize, px_per_char: f64) -> String {
    let max = ((width as f64 - 16.0) / px_per_char) as usize;
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(3)).collect();
        t.push_str("...");
        t
    }
}

fn with_ext(base: &Path, ext: &str) -> PathBuf {
    let mut name = base.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".");
    name.push(ext);
    base.with_file_name(name)
}

/// Compact tick labels: 0.25, 12, 640, 2.5k, 1.2M, 1e-4.
pub fn fmt_tick(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        "0".into()
    } else if a >= 1e9 {
        trim(format!("{:.2}", v / 1e9)) + "G"
    } else if a >= 1e6 {
        trim(format!("{:.2}", v / 1e6)) + "M"
    } else if a >= 1e4 {
        trim(format!("{:.2}", v / 1e3)) + "k"
    } else if a >= 1e-3 {
        let digits = (3 - (a.log10().floor() as i32) - 1).clamp(0, 6) as usize;
        trim(format!("{v:.digits$}"))
    } else {
        format!("{v:.0e}")
    }
}

/// Log-axis labels: only at 1, 2 and 5 times a power of ten (others left blank, so dense
/// tick sets stay readable).
pub fn fmt_log_tick(v: f64) -> String {
    if v.is_nan() || v <= 0.0 {
        return String::new();
    }
    let m = v / 10f64.powf(v.log10().floor());
    if [1.0, 2.0, 5.0, 10.0].iter().any(|t| (m - t).abs() < 1e-6 * t) {
        fmt_tick(v)
    } else {
        String::new()
    }
}

fn trim(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn data_range(chart: &LineChart, axis_x: bool) -> (f64, f64) {
    let scale = if axis_x { chart.x_scale } else { chart.y_scale };
    let vals: Vec<f64> = chart
        .series
        .iter()
        .flat_map(|s| &s.points)
        .filter(|p| usable_point(chart, **p))
        .map(|p| if axis_x { p.0 } else { p.1 })
        .collect();
    let lo = vals.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    match scale {
        Scale::Log => {
            let (lo, hi) = if hi / lo < 1.5 { (lo / 1.5, hi * 1.5) } else { (lo, hi) };
            (lo / 1.15, hi * 1.15)
        }
        Scale::Linear => {
            let span = if hi > lo { hi - lo } else { lo.abs().max(1.0) };
            let pad = if axis_x { 0.02 * span } else { 0.06 * span };
            (lo - pad, hi + pad)
        }
    }
}

fn draw_line_chart<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, c: &LineChart, title_size: u32) -> Result<()> {
    let x = c.x_range.unwrap_or_else(|| data_range(c, true));
    let y = c.y_range.unwrap_or_else(|| data_range(c, false));
    ensure!(x.0 < x.1 && y.0 < y.1, "chart '{}': empty axis range x {x:?} y {y:?}", c.title);
    if c.x_scale == Scale::Log && x.0 <= 0.0 || c.y_scale == Scale::Log && y.0 <= 0.0 {
        bail!("chart '{}': a log axis needs a positive range", c.title);
    }
    match (c.x_scale, c.y_scale) {
        (Scale::Linear, Scale::Linear) => draw_line_with(area, c, title_size, x.0..x.1, y.0..y.1),
        (Scale::Log, Scale::Linear) => draw_line_with(area, c, title_size, (x.0..x.1).log_scale(), y.0..y.1),
        (Scale::Linear, Scale::Log) => draw_line_with(area, c, title_size, x.0..x.1, (y.0..y.1).log_scale()),
        (Scale::Log, Scale::Log) => draw_line_with(area, c, title_size, (x.0..x.1).log_scale(), (y.0..y.1).log_scale()),
    }
}

fn draw_line_with<DB, XS, YS>(
    area: &DrawingArea<DB, Shift>,
    c: &LineChart,
    title_size: u32,
    xs: XS,
    ys: YS,
) -> Result<()>
where
    DB: DrawingBackend,
    XS: AsRangedCoord<Value = f64>,
    YS: AsRangedCoord<Value = f64>,
    XS::CoordDescType: ValueFormatter<f64>,
    YS::CoordDescType: ValueFormatter<f64>,
{
    let err = |e: &dyn std::fmt::Display| anyhow!("chart '{}': {e}", c.title);
    let mut chart = ChartBuilder::on(area)
        .caption(&c.title, (FONT, title_size))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(xs, ys)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(&c.x_label)
        .y_desc(&c.y_label)
        .axis_desc_style((FONT, 15))
        .label_style((FONT, 13))
        .x_label_formatter(&|v| if c.x_scale == Scale::Log { fmt_log_tick(*v) } else { fmt_tick(*v) })
        .y_label_formatter(&|v| if c.y_scale == Scale::Log { fmt_log_tick(*v) } else { fmt_tick(*v) })
        // plotters' log axes draw a minor line at every sub-decade tick: too dense to help.
        .light_line_style(if c.x_scale == Scale::Log || c.y_scale == Scale::Log {
            RGBColor(248, 248, 248)
        } else {
            RGBColor(235, 235, 235)
        })
        .bold_line_style(RGBColor(210, 210, 210))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, s) in c.series.iter().enumerate() {
        let color = PALETTE[s.color.unwrap_or(i) % PALETTE.len()];
        let pts: Vec<(f64, f64)> = s.points.iter().cloned().filter(|p| usable_point(c, *p)).collect();
        let line = color.stroke_width(2);
        let anno = match s.style {
            LineStyle::Solid => chart.draw_series(LineSeries::new(pts, line)).map_err(|e| err(&e))?,
            LineStyle::Dashed => chart.draw_series(DashedLineSeries::new(pts, 8, 6, line)).map_err(|e| err(&e))?,
            LineStyle::Markers => {
                chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(|e| err(&e))?
            }
            LineStyle::SolidMarkers => {
                chart.draw_series(LineSeries::new(pts.clone(), line)).map_err(|e| err(&e))?;
                chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(|e| err(&e))?
            }
        };
        let anno = anno.label(s.name.clone());
        match s.style {
            LineStyle::Markers => {
                anno.legend(move |(x, y)| Circle::new((x + 10, y), 3, color.filled()));
            }
            LineStyle::Dashed => {
                anno.legend(move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (7, 0)], line)
                        + PathElement::new(vec![(13, 0), (20, 0)], line)
                });
            }
            _ => {
                anno.legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], line));
            }
        }
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .position(c.legend.position())
        .draw()
        .map_err(|e| err(&e))?;
    Ok(())
}

fn draw_bar_chart<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, c: &BarChart) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow!("bar chart '{}': {e}", c.title);
    let n = c.categories.len();
    let g = c.series.len();
    let ymax = c.series.iter().flat_map(|(_, v)| v).cloned().fold(0.0f64, f64::max);
    let ymin = c.series.iter().flat_map(|(_, v)| v).cloned().fold(0.0f64, f64::min);
    let span = if ymax > ymin { ymax - ymin } else { 1.0 };
    let (y0, y1) = (if ymin < 0.0 { ymin - 0.08 * span } else { 0.0 }, ymax + 0.12 * span);
    let mut chart = ChartBuilder::on(area)
        .caption(&c.title, (FONT, 22))
        .margin(12)
        .x_label_area_size(56)
        .y_label_area_size(72)
        .build_cartesian_2d(0f64..n as f64, y0..y1)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_label_formatter(&|_| String::new())
        .x_desc(&c.x_label)
        .y_desc(&c.y_label)
        .axis_desc_style((FONT, 15))
        .label_style((FONT, 13))
        .y_label_formatter(&|v| fmt_tick(*v))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(210, 210, 210))
        .draw()
        .map_err(|e| err(&e))?;
    let group_w = 0.8;
    let bar_w = group_w / g as f64;
    for (si, (name, vals)) in c.series.iter().enumerate() {
        let color = PALETTE[si % PALETTE.len()];
        let bars = vals.iter().enumerate().map(move |(ci, &v)| {
            let x0 = ci as f64 + 0.1 + si as f64 * bar_w;
            Rectangle::new([(x0 + 0.01, 0.0), (x0 + bar_w - 0.01, v)], color.filled())
        });
        chart
            .draw_series(bars)
            .map_err(|e| err(&e))?
            .label(name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
        if c.value_labels {
            let style = TextStyle::from((FONT, 12).into_font()).pos(plotters::style::text_anchor::Pos::new(
                plotters::style::text_anchor::HPos::Center,
                plotters::style::text_anchor::VPos::Bottom,
            ));
            let labels = vals.iter().enumerate().map(|(ci, &v)| {
                let xc = ci as f64 + 0.1 + (si as f64 + 0.5) * bar_w;
                Text::new(fmt_tick(v), (xc, v.max(0.0) + 0.01 * span), style.clone())
            });
            chart.draw_series(labels).map_err(|e| err(&e))?;
        }
    }
    // Category names under the groups, placed in pixels below the plotting area.
    let base = area.get_base_pixel();
    let style = TextStyle::from((FONT, 14).into_font()).pos(plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Top,
    ));
    for (ci, name) in c.categories.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(ci as f64 + 0.5, y0));
        area.draw(&Text::new(name.clone(), (px - base.0, py - base.1 + 6), style.clone())).map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| err(&e))?;
    Ok(())
}
