// BullMQ by the method of compare/main.go: producers add N jobs one call
// each (enqueue phase), then a Worker of concurrency C with a no-op
// processor works the prefilled queue (process phase). Prints one JSON
// line with the same fields. Flushes the Redis it is given.
import { Queue, Worker } from 'bullmq';
import IORedis from 'ioredis';

const arg = (name, def) => {
  const i = process.argv.indexOf('-' + name);
  return i > 0 ? process.argv[i + 1] : def;
};
const [host, port] = arg('redis', '127.0.0.1:6379').split(':');
const jobs = Number(arg('jobs', '20000'));
const producers = Number(arg('producers', '8'));
const concurrency = Number(arg('concurrency', '100'));
const connection = { host, port: Number(port), maxRetriesPerRequest: null };

const info = new IORedis(connection);
// used_cpu_sys + used_cpu_user in µs, and every command's calls (INFO's own left out).
async function readInfo() {
  const text = await info.info('cpu', 'commandstats');
  let cpu = 0, calls = 0;
  for (const line of text.split('\n')) {
    const [name, val] = line.trim().split(':');
    if (name === 'used_cpu_sys' || name === 'used_cpu_user') cpu += Number(val) * 1e6;
    else if (name && name.startsWith('cmdstat_') && name !== 'cmdstat_info') calls += Number(val.split(',')[0].slice(6));
  }
  return { cpu: Math.round(cpu), calls };
}

await info.flushall();
const queue = new Queue('compare', { connection });
await queue.waitUntilReady();
const payload = { p: '0123456789abcdef' };
const row = { system: 'bullmq', jobs, producers, concurrency };

let m = await readInfo();
let start = process.hrtime.bigint();
let next = 0;
await Promise.all(Array.from({ length: producers }, async () => {
  while (next < jobs) {
    next++;
    await queue.add('job', payload, { removeOnComplete: true, removeOnFail: true });
  }
}));
let secs = Number(process.hrtime.bigint() - start) / 1e9;
let m2 = await readInfo();
row.enqueue_jobs_per_s = jobs / secs;
row.enqueue_redis_cpu_us_per_job = (m2.cpu - m.cpu) / jobs;
row.enqueue_redis_cmds_per_job = (m2.calls - m.calls) / jobs;

m = await readInfo();
start = process.hrtime.bigint();
let done = 0;
let worker;
await new Promise((resolve, reject) => {
  worker = new Worker('compare', async () => {}, { connection, concurrency });
  worker.on('completed', () => { if (++done === jobs) resolve(); });
  worker.on('error', reject);
});
secs = Number(process.hrtime.bigint() - start) / 1e9;
m2 = await readInfo();
row.process_jobs_per_s = jobs / secs;
row.process_redis_cpu_us_per_job = (m2.cpu - m.cpu) / jobs;
row.process_redis_cmds_per_job = (m2.calls - m.calls) / jobs;
await worker.close();
await queue.close();
await info.quit();
console.log(JSON.stringify(row));
