// Level of detail for the Gantt: when a view holds more actions than there are pixels to show
// them, draw per pixel column the kind that kept each lane busiest instead of every action.
//
// Per row and lane, the visible time range is cut into `buckets` columns; each action adds the
// time it overlaps each column to (row, column, kind). A column whose lane is busy for less than
// `minBusy` of its width stays empty, so pipeline bubbles wider than a column still show. Runs of
// adjacent columns with the same dominant kind merge into one bar that counts the actions
// starting inside it. The result has at most rows x 2 lanes x buckets bars, whatever the input.

/**
 * events: [{worker, kind, start, end}], rows: [{worker, index}], range: [lo, hi].
 * kindIndex: Map kind -> index (unknown kinds use index `laneOf.length - 1`);
 * laneOf[index]: 0 for the compute lane, 1 for the communication lane.
 * Returns bars [{row, kind: index, start, end, count}].
 */
export function aggregateByPixel(events, rows, range, buckets, kindIndex, laneOf, minBusy = 0.05) {
  const [lo, hi] = range;
  const width = (hi - lo) / buckets;
  const kinds = laneOf.length;
  const other = kinds - 1;
  const rowOf = new Map(rows.map((r) => [r.worker, r.index]));
  const nRows = rows.length;
  const busy = new Float64Array(nRows * buckets * kinds); // time per (row, column, kind)
  const starts = new Uint32Array(nRows * buckets * 2); // actions starting per (row, column, lane)

  for (const e of events) {
    const row = rowOf.get(e.worker);
    if (row === undefined) continue;
    const k = kindIndex.get(e.kind) ?? other;
    const a = Math.max(e.start, lo);
    const b = Math.min(e.end, hi);
    if (b < a) continue;
    const first = Math.min(buckets - 1, Math.floor((a - lo) / width));
    const last = Math.min(buckets - 1, Math.floor((b - lo) / width));
    starts[(row * buckets + first) * 2 + laneOf[k]] += 1;
    if (first === last) {
      busy[(row * buckets + first) * kinds + k] += Math.max(b - a, width * 1e-3);
      continue;
    }
    for (let col = first; col <= last; col++) {
      const c0 = lo + col * width;
      const overlap = Math.min(b, c0 + width) - Math.max(a, c0);
      if (overlap > 0) busy[(row * buckets + col) * kinds + k] += overlap;
    }
  }

  const bars = [];
  for (let row = 0; row < nRows; row++) {
    for (let lane = 0; lane < 2; lane++) {
      let open = null;
      for (let col = 0; col < buckets; col++) {
        let best = -1;
        let bestBusy = 0;
        let total = 0;
        const cell = (row * buckets + col) * kinds;
        for (let k = 0; k < kinds; k++) {
          if (laneOf[k] !== lane) continue;
          const t = busy[cell + k];
          total += t;
          if (t > bestBusy) { bestBusy = t; best = k; }
        }
        const count = starts[(row * buckets + col) * 2 + lane];
        if (total < minBusy * width) best = -1;
        if (open && open.kind === best) {
          open.end = lo + (col + 1) * width;
          open.count += count;
          continue;
        }
        if (open) bars.push(open);
        open = best < 0 ? null : { row, kind: best, start: lo + col * width, end: lo + (col + 1) * width, count };
      }
      if (open) bars.push(open);
    }
  }
  return bars;
}
