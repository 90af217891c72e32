// bench/ort_profile.js FILE BATCH RUNS THREADS [TOP]: ONNX Runtime's own per-node profile
// (npm's onnxruntime-node, `enableProfiling`) of FILE, a model with one float input of
// shape [BATCH, 3, 224, 224] (uniform in [-0.5, 0.5)), run RUNS times on THREADS intra-op
// threads.  Prints each kind of node's time per forward in microseconds: the median of
// each node over the runs after the first five, summed by kind; a Conv's kind comes from
// its weight's shape (dwconvKxK: one input channel per group; conv1x1; convKxK), so the
// depthwise layers and the 1x1 products are counted apart.  With TOP, also the TOP
// slowest nodes.  For comparing layer by layer with Grove (docs/performance-models.md,
// "MobileNetV2, MobileNetV3-Large, EfficientNet-B0 layer by layer"); NODE_PATH names
// onnxruntime-node's folder (bench/peers_lib.sh installs it into /tmp/grove-peers).
// Figures only.
const ort = require('onnxruntime-node');
const fs = require('fs');
const os = require('os');
const path = require('path');
(async () => {
  const [file, batch, runs, threads, top] = process.argv.slice(2);
  if (!file || !(+batch > 0) || !(+runs > 5) || !(+threads > 0)) {
    console.error('usage: node bench/ort_profile.js FILE BATCH RUNS(>5) THREADS [TOP]');
    process.exit(2);
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ort-profile-'));
  const s = await ort.InferenceSession.create(file, {intraOpNumThreads: +threads,
    interOpNumThreads: 1, enableProfiling: true, profileFilePrefix: path.join(dir, 'p')});
  const shape = [+batch, 3, 224, 224];
  const n = shape.reduce((a, c) => a * c, 1);
  const feeds = {[s.inputNames[0]]: new ort.Tensor('float32',
    Float32Array.from({length: n}, () => Math.random() - 0.5), shape)};
  for (let i = 0; i < +runs; i++) await s.run(feeds);
  s.endProfiling(); /* writes p_<date>.json into dir (onnxruntime-node returns nothing) */
  const files = fs.readdirSync(dir).filter((f) => f.endsWith('.json'));
  if (files.length !== 1) {
    console.error(`ort_profile: expected one profile in ${dir}, found ${files.length}`);
    process.exit(1);
  }
  const prof = path.join(dir, files[0]);
  const per = new Map(), info = new Map();
  for (const e of JSON.parse(fs.readFileSync(prof, 'utf8'))) {
    if (e.cat !== 'Node' || !e.name.endsWith('_kernel_time')) continue;
    const name = e.name.slice(0, -'_kernel_time'.length);
    if (!per.has(name)) per.set(name, []);
    per.get(name).push(e.dur);
    info.set(name, e.args);
  }
  fs.rmSync(dir, {recursive: true, force: true});
  const kind = (a) => {
    const op = a.op_name || '?';
    if (!op.includes('Conv')) return op;
    const ins = a.input_type_shape;
    const w = ins && ins[1] && Object.values(ins[1])[0];
    if (!w || w.length !== 4) return op;
    if (w[1] === 1 && w[0] > 1) return `dwconv${w[2]}x${w[3]}`;
    return w[2] === 1 && w[3] === 1 ? 'conv1x1' : `conv${w[2]}x${w[3]}`;
  };
  const byKind = new Map(), nodes = [];
  let total = 0;
  for (const [name, d] of per) {
    const v = d.slice(5).sort((a, b) => a - b);
    const med = v.length ? v[v.length >> 1] : 0;
    const k = kind(info.get(name));
    byKind.set(k, (byKind.get(k) || 0) + med);
    total += med;
    nodes.push([med, k, name]);
  }
  console.log(`${path.basename(file)}: batch ${batch}, ${threads} thread(s), ${runs} runs: ` +
              `${total.toFixed(0)} us per forward (sum of node medians)`);
  for (const [k, v] of [...byKind].sort((a, b) => b[1] - a[1]))
    console.log(`  ${k.padEnd(18)} ${v.toFixed(0).padStart(8)} us ` +
                `${(100 * v / total).toFixed(1).padStart(5)}%`);
  if (top) {
    nodes.sort((a, b) => b[0] - a[0]);
    for (const [m, k, name] of nodes.slice(0, +top))
      console.log(`  ${m.toFixed(0).padStart(8)} us  ${k.padEnd(12)} ${name.slice(-70)}`);
  }
})();
