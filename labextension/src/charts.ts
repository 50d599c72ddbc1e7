/**
 * Small dependency-free SVG line charts: one line per task.
 */
const SVG = 'http://www.w3.org/2000/svg';
const W = 320;
const H = 130;
const PAD = { left: 42, right: 8, top: 8, bottom: 18 };

export const PALETTE = [
  '#1f77b4',
  '#ff7f0e',
  '#2ca02c',
  '#d62728',
  '#9467bd',
  '#8c564b',
  '#e377c2',
  '#7f7f7f',
  '#bcbd22',
  '#17becf'
];

export interface ILine {
  name: string;
  color: string;
  points: [number, number][];
}

function el(name: string, attrs: { [k: string]: string | number }): SVGElement {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) {
    node.setAttribute(k, String(v));
  }
  return node;
}

function fmt(v: number): string {
  const a = Math.abs(v);
  if (a >= 1000) {
    return `${(v / 1000).toFixed(a >= 10000 ? 0 : 1)}k`;
  }
  return a >= 10 || v === 0 ? v.toFixed(0) : v.toFixed(1);
}

/** Draw ``lines`` into ``host`` (replacing what was there). ``yFloor``: the y axis reaches at
 * least this high, drawn as a dashed line (a threshold that matters), so noise far below it is
 * not magnified into a trend by an axis scaled to the noise. ``yTop``: the y axis reaches at
 * least this high, without a line (100 for a percentage). ``empty``: said without data. */
export function drawChart(
  host: HTMLElement,
  lines: ILine[],
  xIsTime: boolean,
  yFloor = 0,
  yTop = 0,
  empty = 'no data yet'
): void {
  host.textContent = '';
  const pts = lines.flatMap(l => l.points);
  const svg = el('svg', {
    viewBox: `0 0 ${W} ${H}`,
    preserveAspectRatio: 'none',
    class: 'tfdist-lab-svg'
  });
  host.appendChild(svg);
  if (pts.length === 0) {
    const t = el('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'tfdist-lab-empty' });
    t.textContent = empty;
    svg.appendChild(t);
    return;
  }
  let x0 = Math.min(...pts.map(p => p[0]));
  let x1 = Math.max(...pts.map(p => p[0]));
  let y1 = Math.max(...pts.map(p => p[1]));
  const y0 = Math.min(0, ...pts.map(p => p[1]));
  if (x1 === x0) {
    x0 -= 1;
    x1 += 1;
  }
  y1 = Math.max(y1, yFloor, yTop);
  if (y1 === y0) {
    y1 = y0 + 1;
  }
  y1 *= 1.05;
  const sx = (x: number) => PAD.left + ((x - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
  const sy = (y: number) => H - PAD.bottom - ((y - y0) / (y1 - y0)) * (H - PAD.top - PAD.bottom);
  svg.appendChild(
    el('line', { x1: PAD.left, y1: sy(y0), x2: W - PAD.right, y2: sy(y0), class: 'tfdist-lab-axis' })
  );
  svg.appendChild(
    el('line', { x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: H - PAD.bottom, class: 'tfdist-lab-axis' })
  );
  for (const [y, label] of [
    [y1, fmt(y1)],
    [(y0 + y1) / 2, fmt((y0 + y1) / 2)],
    [y0, fmt(y0)]
  ] as [number, string][]) {
    const t = el('text', { x: PAD.left - 4, y: sy(y) + 3, 'text-anchor': 'end', class: 'tfdist-lab-tick' });
    t.textContent = label;
    svg.appendChild(t);
  }
  if (yFloor > 0) {
    svg.appendChild(
      el('line', {
        x1: PAD.left,
        y1: sy(yFloor),
        x2: W - PAD.right,
        y2: sy(yFloor),
        class: 'tfdist-lab-floor'
      })
    );
  }
  const xl = el('text', { x: W - PAD.right, y: H - 4, 'text-anchor': 'end', class: 'tfdist-lab-tick' });
  xl.textContent = xIsTime ? `last ${fmt(x1 - x0)} s` : `steps ${fmt(x0)}-${fmt(x1)}`;
  svg.appendChild(xl);
  for (const line of lines) {
    if (line.points.length === 0) {
      continue;
    }
    const d = line.points
      .map((p, i) => `${i ? 'L' : 'M'}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`)
      .join('');
    const path = el('path', { d, stroke: line.color, class: 'tfdist-lab-line-path' });
    path.setAttribute('data-task', line.name);
    svg.appendChild(path);
  }
}
