//! A small PNG line chart for miss-ratio curves: log-scale cache size
//! against miss ratio, one colour per policy. Self-contained (a 5x7 pixel
//! font, no system fonts), so it works on a bare server.

use std::path::Path;

use anyhow::{Context, Result};
use arcache_sim::MrcPoint;

const W: usize = 900;
const H: usize = 560;
const LEFT: usize = 80;
const RIGHT: usize = 30;
const TOP: usize = 50;
const BOTTOM: usize = 70;
const COLOURS: [[u8; 3]; 6] =
    [[31, 119, 180], [214, 39, 40], [44, 160, 44], [148, 103, 189], [255, 127, 14], [23, 190, 207]];

struct Canvas {
    px: Vec<u8>,
}

impl Canvas {
    fn new() -> Canvas {
        Canvas { px: vec![255; W * H * 3] }
    }

    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if x >= 0 && y >= 0 && (x as usize) < W && (y as usize) < H {
            let i = (y as usize * W + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }

    /// A line `thick` pixels wide (Bresenham, with a square pen).
    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: [u8; 3], thick: i64) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            for ox in 0..thick {
                for oy in 0..thick {
                    self.set(x + ox - thick / 2, y + oy - thick / 2, c);
                }
            }
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// Text at (x, y) top-left, `scale` pixels per font pixel.
    fn text(&mut self, x: i64, y: i64, s: &str, scale: i64, c: [u8; 3]) {
        for (i, ch) in s.chars().enumerate() {
            let rows = glyph(ch);
            for (r, bits) in rows.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        for ox in 0..scale {
                            for oy in 0..scale {
                                self.set(x + (i as i64 * 6 + col) * scale + ox, y + r as i64 * scale + oy, c);
                            }
                        }
                    }
                }
            }
        }
    }
}

fn text_width(s: &str, scale: i64) -> i64 {
    s.chars().count() as i64 * 6 * scale
}

/// 5x7 glyphs, one byte per row, bit 4 the leftmost column.
fn glyph(c: char) -> [u8; 7] {
    match c.to_ascii_lowercase() {
        '0' => [14, 17, 19, 21, 25, 17, 14],
        '1' => [4, 12, 4, 4, 4, 4, 14],
        '2' => [14, 17, 1, 2, 4, 8, 31],
        '3' => [31, 2, 4, 2, 1, 17, 14],
        '4' => [2, 6, 10, 18, 31, 2, 2],
        '5' => [31, 16, 30, 1, 1, 17, 14],
        '6' => [6, 8, 16, 30, 17, 17, 14],
        '7' => [31, 1, 2, 4, 8, 8, 8],
        '8' => [14, 17, 17, 14, 17, 17, 14],
        '9' => [14, 17, 17, 15, 1, 2, 12],
        'a' => [0, 0, 14, 1, 15, 17, 15],
        'b' => [16, 16, 22, 25, 17, 17, 30],
        'c' => [0, 0, 14, 16, 16, 17, 14],
        'd' => [1, 1, 13, 19, 17, 17, 15],
        'e' => [0, 0, 14, 17, 31, 16, 14],
        'f' => [6, 9, 8, 28, 8, 8, 8],
        'g' => [0, 15, 17, 17, 15, 1, 14],
        'h' => [16, 16, 22, 25, 17, 17, 17],
        'i' => [4, 0, 12, 4, 4, 4, 14],
        'j' => [2, 0, 6, 2, 2, 18, 12],
        'k' => [16, 16, 18, 20, 24, 20, 18],
        'l' => [12, 4, 4, 4, 4, 4, 14],
        'm' => [0, 0, 26, 21, 21, 17, 17],
        'n' => [0, 0, 22, 25, 17, 17, 17],
        'o' => [0, 0, 14, 17, 17, 17, 14],
        'p' => [0, 0, 30, 17, 30, 16, 16],
        'q' => [0, 0, 13, 19, 15, 1, 1],
        'r' => [0, 0, 22, 25, 16, 16, 16],
        's' => [0, 0, 14, 16, 14, 1, 30],
        't' => [8, 8, 28, 8, 8, 9, 6],
        'u' => [0, 0, 17, 17, 17, 19, 13],
        'v' => [0, 0, 17, 17, 17, 10, 4],
        'w' => [0, 0, 17, 17, 21, 21, 10],
        'x' => [0, 0, 17, 10, 4, 10, 17],
        'y' => [0, 0, 17, 17, 15, 1, 14],
        'z' => [0, 0, 31, 2, 4, 8, 31],
        '.' => [0, 0, 0, 0, 0, 12, 12],
        ',' => [0, 0, 0, 0, 12, 4, 8],
        '-' => [0, 0, 0, 31, 0, 0, 0],
        '_' => [0, 0, 0, 0, 0, 0, 31],
        '%' => [24, 25, 2, 4, 8, 19, 3],
        '(' => [2, 4, 8, 8, 8, 4, 2],
        ')' => [8, 4, 2, 2, 2, 4, 8],
        '/' => [0, 1, 2, 4, 8, 16, 0],
        ':' => [0, 12, 12, 0, 12, 12, 0],
        '=' => [0, 0, 31, 0, 31, 0, 0],
        _ => [0; 7],
    }
}

fn compact(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 && n % 1_000_000_000 == 0 => format!("{}g", n / 1_000_000_000),
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}m", n / 1_000_000),
        n if n >= 1000 && n % 1000 == 0 => format!("{}k", n / 1000),
        n => n.to_string(),
    }
}

/// Draws the curves (miss ratio = 1 - hit ratio) and writes a PNG.
pub fn miss_ratio_png(path: &Path, title: &str, curves: &[(String, Vec<MrcPoint>)]) -> Result<()> {
    let mut cv = Canvas::new();
    let all: Vec<u64> = curves.iter().flat_map(|(_, p)| p.iter().map(|q| q.cache_blocks.max(1))).collect();
    let (lo, hi) = (all.iter().copied().min().unwrap_or(1), all.iter().copied().max().unwrap_or(10));
    let (llo, lhi) =
        ((lo as f64).log10().floor(), (hi as f64).log10().ceil().max((lo as f64).log10().floor() + 1.0));
    let (pw, ph) = ((W - LEFT - RIGHT) as f64, (H - TOP - BOTTOM) as f64);
    let xpix = |c: u64| LEFT as i64 + (((c.max(1) as f64).log10() - llo) / (lhi - llo) * pw).round() as i64;
    let ypix = |miss: f64| TOP as i64 + ((1.0 - miss.clamp(0.0, 1.0)) * ph).round() as i64;
    let grey = [220, 220, 220];
    let black = [0, 0, 0];
    for d in llo as i64..=lhi as i64 {
        let x = xpix(10u64.pow(d.clamp(0, 18) as u32));
        cv.line((x, TOP as i64), (x, (H - BOTTOM) as i64), grey, 1);
        let label = compact(10u64.pow(d.clamp(0, 18) as u32));
        cv.text(x - text_width(&label, 2) / 2, (H - BOTTOM + 10) as i64, &label, 2, black);
    }
    for i in 0..=10 {
        let m = i as f64 / 10.0;
        let y = ypix(m);
        cv.line((LEFT as i64, y), ((W - RIGHT) as i64, y), grey, 1);
        let label = format!("{:.1}", m);
        cv.text(LEFT as i64 - 10 - text_width(&label, 2), y - 7, &label, 2, black);
    }
    cv.line((LEFT as i64, TOP as i64), (LEFT as i64, (H - BOTTOM) as i64), black, 2);
    cv.line((LEFT as i64, (H - BOTTOM) as i64), ((W - RIGHT) as i64, (H - BOTTOM) as i64), black, 2);
    let xlabel = "cache size (blocks, log scale)";
    cv.text((W as i64 - text_width(xlabel, 2)) / 2, (H - 30) as i64, xlabel, 2, black);
    cv.text(8, (TOP - 30) as i64, "miss ratio", 2, black);
    let t = format!("miss-ratio curve: {title}");
    cv.text((W as i64 - text_width(&t, 2)) / 2, 12, &t, 2, black);
    for (i, (name, points)) in curves.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let mut pts: Vec<&MrcPoint> = points.iter().collect();
        pts.sort_by_key(|p| p.cache_blocks);
        for w in pts.windows(2) {
            let a = (xpix(w[0].cache_blocks), ypix(1.0 - w[0].hit_ratio));
            let b = (xpix(w[1].cache_blocks), ypix(1.0 - w[1].hit_ratio));
            cv.line(a, b, c, 3);
        }
        let ly = TOP as i64 + 10 + i as i64 * 22;
        let lx = (W - RIGHT - 170) as i64;
        cv.line((lx, ly + 7), (lx + 30, ly + 7), c, 3);
        cv.text(lx + 40, ly, name, 2, black);
    }
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), W as u32, H as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().context("writing the PNG header")?;
    w.write_image_data(&cv.px).context("writing the PNG")?;
    Ok(())
}
