// Histogram and heatmap drawings (canvas: pixels and canvas text only).
import { h, fmtNum } from "./dom.js";

export function drawHistogram(canvas, hist, color) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width;
  const H = canvas.height;
  ctx.clearRect(0, 0, W, H);
  if (!hist || !hist.counts || !hist.counts.length) {
    ctx.fillStyle = "#888";
    ctx.font = "12px sans-serif";
    ctx.fillText("no finite values", 10, 20);
    return;
  }
  const counts = hist.counts;
  const max = Math.max(...counts) || 1;
  const top = 8;
  const bottom = 20;
  const bw = W / counts.length;
  ctx.fillStyle = color || "#4c78a8";
  for (let i = 0; i < counts.length; i++) {
    const bh = ((H - top - bottom) * counts[i]) / max;
    ctx.fillRect(i * bw + 0.5, H - bottom - bh, Math.max(1, bw - 1), bh);
  }
  ctx.fillStyle = "#333";
  ctx.font = "11px sans-serif";
  ctx.textAlign = "left";
  ctx.fillText(fmtNum(hist.lo), 2, H - 5);
  ctx.textAlign = "right";
  ctx.fillText(fmtNum(hist.hi), W - 2, H - 5);
  ctx.textAlign = "center";
  ctx.fillText("max bin " + fmtNum(max), W / 2, H - 5);
}

function color(t) {
  // diverging blue (low) - white - red (high), t in [0, 1]
  const c = Math.max(0, Math.min(1, t));
  if (c < 0.5) {
    const k = c / 0.5;
    return [Math.round(59 + (255 - 59) * k), Math.round(76 + (255 - 76) * k), Math.round(192 + (255 - 192) * k)];
  }
  const k = (c - 0.5) / 0.5;
  return [Math.round(255 - (255 - 180) * k), Math.round(255 - (255 - 4) * k), Math.round(255 - (255 - 38) * k)];
}

export function drawHeatmap(hm) {
  const rows = hm.values.length;
  const cols = rows ? hm.values[0].length : 0;
  const canvas = h("canvas", { class: "heatmap", width: String(cols), height: String(rows) });
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(cols, rows);
  const lo = hm.min === null ? 0 : hm.min;
  const hi = hm.max === null ? 1 : hm.max;
  const span = hi - lo || 1;
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const v = hm.values[r][c];
      const o = 4 * (r * cols + c);
      const rgb = v === null ? [0, 0, 0] : color((v - lo) / span);
      img.data[o] = rgb[0];
      img.data[o + 1] = rgb[1];
      img.data[o + 2] = rgb[2];
      img.data[o + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
  const scale = Math.max(1, Math.floor(256 / Math.max(rows, cols, 1)));
  canvas.style.width = cols * scale + "px";
  canvas.style.height = rows * scale + "px";
  const idx = hm.index && hm.index.length ? "[" + hm.index.join(", ") + ", :, :]" : "";
  return h(
    "div",
    null,
    canvas,
    h("p", { class: "dim" }, "slice " + idx + " of [" + hm.shape.join(", ") + "], " + rows + "×" + cols + " cells (rows/cols picked evenly); blue " + fmtNum(lo) + " → red " + fmtNum(hi) + "; black: NaN/inf"),
  );
}
