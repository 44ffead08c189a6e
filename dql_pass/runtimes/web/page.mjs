// The page side of dql_pass's web runtimes: one onnxruntime-web session per page, tensors in and
// out as base64 of their raw bytes (typed arrays are views of those bytes: no value is converted).
const ARRAYS = {
  float32: Float32Array, float64: Float64Array, int8: Int8Array, uint8: Uint8Array, int16: Int16Array,
  uint16: Uint16Array, int32: Int32Array, uint32: Uint32Array, int64: BigInt64Array, uint64: BigUint64Array,
  bool: Uint8Array, float16: Uint16Array,
};
let ort = null;
let session = null;

// The GPU work the page asks for, counted at the WebGPU API before onnxruntime-web loads (its
// WebGPU provider calls these methods on the objects, so every call of it goes through here):
// compute dispatches, queue submits, and readbacks (a buffer mapped for reading: how a tensor
// comes back from the GPU to the CPU).
const calls = {dispatches: 0, submits: 0, readbacks: 0};

function counted(prototype, method, key, counts = () => true) {
  const original = prototype?.[method];
  if (!original) return;
  prototype[method] = function (...args) {
    if (counts(...args)) calls[key] += 1;
    return original.apply(this, args);
  };
}

counted(globalThis.GPUComputePassEncoder?.prototype, 'dispatchWorkgroups', 'dispatches');
counted(globalThis.GPUComputePassEncoder?.prototype, 'dispatchWorkgroupsIndirect', 'dispatches');
counted(globalThis.GPUQueue?.prototype, 'submit', 'submits');
counted(globalThis.GPUBuffer?.prototype, 'mapAsync', 'readbacks', mode => (mode & GPUMapMode.READ) !== 0);

// What `work` returned, the calls made while it ran, and the seconds it took (in the page: no
// protocol round trip, no browser start).
async function counting(work) {
  const before = {...calls};
  const began = performance.now();
  const value = await work();
  const seconds = (performance.now() - began) / 1000;
  return {value, seconds, gpu: Object.fromEntries(Object.keys(calls).map(key => [key, calls[key] - before[key]]))};
}

function bytesOf(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

function textOf(view) {
  const bytes = new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
  let binary = '';
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

export async function load({bundle, provider, model, externalData, optimize, verbose}) {
  ort = await import(bundle);
  ort.env.wasm.numThreads = 1;  // no cross-origin isolation, and one thread is deterministic
  ort.env.logLevel = verbose ? 'verbose' : 'error';
  const options = {executionProviders: [provider], graphOptimizationLevel: optimize, logSeverityLevel: verbose ? 0 : 3};
  if (externalData) options.externalData = externalData;
  // As the onnxruntime adapter does: below "all", no QDQ transformer moves or duplicates DequantizeLinear.
  if (optimize !== 'all') options.extra = {session: {disable_quant_qdq: '1'}};
  // A recycled page: the session before this one goes first (its GPU buffers with it).
  if (session) await session.release();
  session = null;
  const created = await counting(() => ort.InferenceSession.create(model, options));
  session = created.value;
  let adapter = null;
  if (provider === 'webgpu') {
    const info = (await navigator.gpu.requestAdapter())?.info;
    adapter = info ? `${info.vendor} ${info.architecture}` : null;
  }
  return {inputs: session.inputNames, outputs: session.outputNames, adapter, gpu: created.gpu, seconds: created.seconds};
}

export async function run(feeds, fetches) {
  const tensors = {};
  for (const [name, {type, dims, data}] of Object.entries(feeds)) {
    const bytes = bytesOf(data);
    tensors[name] = new ort.Tensor(type, new ARRAYS[type](bytes.buffer, 0, bytes.length / ARRAYS[type].BYTES_PER_ELEMENT), dims);
  }
  const {value: results, gpu, seconds} = await counting(() => session.run(tensors, fetches));
  const outputs = {};
  for (const name of fetches) {
    const t = results[name];
    outputs[name] = {type: t.type, dims: t.dims, data: textOf(t.data)};
  }
  return {outputs, gpu, seconds};
}
