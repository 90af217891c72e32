// bench/ort_bench.js FILE NAME BATCHES THREADS SECONDS META WARMUP ID_BASE: ONNX Runtime
// (npm's onnxruntime-node, CPU) on FILE, one JSON line of samples/s per batch size, for
// bench/peers_lib.sh (peers_run_ort; NODE_PATH names onnxruntime-node's folder).  META is
// the PyTorch step's MODEL.meta.json: one {shape, dtype} (a single input) or a list of
// them, shapes without the batch dimension.  Float inputs are uniform in [-0.5, 0.5); the
// first int64 input gets token ids ID_BASE + i % 997 (1 keeps clear of a padding id 0), a
// later one (a mask, positions) i % its last dimension.
const ort = require('onnxruntime-node');
(async () => {
  const [file, name, batches, threads, secs, metaFile, warmup, idBase] = process.argv.slice(2);
  const read = JSON.parse(require('fs').readFileSync(metaFile, 'utf8'));
  const meta = Array.isArray(read) ? read : [read];
  const s = await ort.InferenceSession.create(file, {intraOpNumThreads: +threads, interOpNumThreads: 1});
  for (const b of batches.split(',').map(Number)) {
    const feeds = {};
    meta.forEach((m, k) => {
      const shape = [b, ...m.shape];
      const n = shape.reduce((a, c) => a * c, 1);
      const last = m.shape.length ? m.shape[m.shape.length - 1] : 1;
      feeds[s.inputNames[k]] = m.dtype === 'int64'
        ? new ort.Tensor('int64', BigInt64Array.from({length: n}, (_, i) => BigInt(k ? i % last : +idBase + i % 997)), shape)
        : new ort.Tensor('float32', Float32Array.from({length: n}, () => Math.random() - 0.5), shape);
    });
    for (let i = 0; i < +warmup; i++) await s.run(feeds);
    let k = 0; const t0 = process.hrtime.bigint(); let dt = 0;
    for (;;) { await s.run(feeds); k++; dt = Number(process.hrtime.bigint() - t0) / 1e9; if (dt > +secs) break; }
    dt /= k;
    console.log(JSON.stringify({engine: 'onnxruntime-' + require('onnxruntime-node/package.json').version,
      model: name, batch: b, samples_per_s: +(b / dt).toFixed(1), ms_per_batch: +(dt * 1e3).toFixed(4)}));
  }
})();
