// Drives kvf-router with the official `openai` npm client: completions and chat completions,
// streaming and not, one session. Prints one JSON line per call and exits non-zero on the
// first failed expectation. Usage: node openai_client.mjs BASE_URL MODEL
// The package is looked up in $KVF_OPENAI_NODE_MODULES (a node_modules folder), else as usual:
// the repository's node_modules, where scripts/setup installs the version package-lock.json pins.
import { createRequire } from 'node:module';

const modules = process.env.KVF_OPENAI_NODE_MODULES;
const require = createRequire(modules ? `${modules}/` : import.meta.url);
const openai = require('openai');
const OpenAI = openai.default ?? openai;

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({
  baseURL, apiKey: 'unused', maxRetries: 0, timeout: 30000,
  defaultHeaders: { 'X-Session-Id': 'openai-client-session' },
});

function check(cond, what) {
  if (!cond) { console.error(`FAILED: ${what}`); process.exit(1); }
}

const system = 'You are a careful assistant. '.repeat(40);
const models = await client.models.list();
check(models.data.some((m) => m.id === model), `models.list has ${model}`);

const c = await client.completions.create({ model, prompt: system + 'Say hi.', max_tokens: 8 });
check(c.object === 'text_completion', 'completion object');
check(c.choices.length === 1 && typeof c.choices[0].text === 'string', 'completion text');
check(c.usage.completion_tokens === 8, 'completion_tokens == max_tokens');
console.log(JSON.stringify({ call: 'completions', usage: c.usage }));

const cs = await client.completions.create({ model, prompt: system + 'Say hi again.', max_tokens: 6, stream: true });
let pieces = 0; let text = '';
for await (const chunk of cs) { pieces += 1; text += chunk.choices[0]?.text ?? ''; }
check(pieces >= 6, `completion stream has >= 6 chunks (got ${pieces})`);
console.log(JSON.stringify({ call: 'completions_stream', chunks: pieces, chars: text.length }));

const messages = [{ role: 'system', content: system }, { role: 'user', content: 'What is a KV cache?' }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 10 });
check(chat.object === 'chat.completion', 'chat object');
check(chat.choices[0].message.role === 'assistant', 'assistant message');
check(chat.usage.completion_tokens === 10, 'chat completion_tokens');
const cached1 = chat.usage.prompt_tokens_details?.cached_tokens ?? 0;
console.log(JSON.stringify({ call: 'chat', usage: chat.usage }));

// Turn 2 of the same session re-sends turn 1: the router must send it where turn 1's prefix is.
messages.push({ role: 'assistant', content: chat.choices[0].message.content });
messages.push({ role: 'user', content: 'And why does routing matter?' });
const stream = await client.chat.completions.create({
  model, messages, max_tokens: 12, stream: true, stream_options: { include_usage: true },
});
let deltas = 0; let usage = null; let finish = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const choice of chunk.choices) {
    if (choice.delta?.content) deltas += 1;
    if (choice.finish_reason) finish = choice.finish_reason;
  }
}
check(deltas >= 1 && finish === 'length', `chat stream deltas=${deltas} finish=${finish}`);
check(usage !== null && usage.completion_tokens === 12, 'chat stream usage');
const cached2 = usage.prompt_tokens_details?.cached_tokens ?? 0;
check(cached2 > cached1, `turn 2 hits turn 1's prefix (cached ${cached2} > ${cached1})`);
console.log(JSON.stringify({ call: 'chat_stream', deltas, usage }));

// Errors carry OpenAI's (and vLLM's) param and code: a body of the wrong shape and a value out
// of range, each naming its field.
let rejected = false;
try {
  await client.chat.completions.create({ model, messages: 'not-a-list' });
} catch (e) {
  rejected = e.status === 400 && typeof e.message === 'string' && e.param === 'messages' &&
    e.code === 400;
  console.log(JSON.stringify({ call: 'bad_request', status: e.status, param: e.param, code: e.code }));
}
check(rejected, 'malformed request rejected with 400, param "messages", code 400');
let range_rejected = false;
try {
  await client.completions.create({ model, prompt: [1, 2, 3], max_tokens: -1 });
} catch (e) {
  range_rejected = e.status === 400 && e.param === 'max_tokens' && e.code === 400;
  console.log(JSON.stringify({ call: 'bad_max_tokens', status: e.status, param: e.param, code: e.code }));
}
check(range_rejected, 'negative max_tokens rejected with 400, param "max_tokens", code 400');
console.log('ALL OK');
