"""The language and sequence archs of ``compiler.tools.archs``: GPT-2, Llama, a BERT-style encoder,
LSTM/GRU/RNN sequence models and a wav2vec2-style audio encoder."""
from __future__ import annotations

import math

import numpy as np

from .common import F, RMSNorm, _arch, _seed, nn, torch


# -- GPT-2 (Radford et al. 2019; nanoGPT's layout) -----------------------------------------------

class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.n_head, self.n_embd = n_head, n_embd
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GPT2Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """Token and position embeddings, pre-norm blocks with the causal mask from ``torch.tril`` and
    ``masked_fill``, tanh-approximated GELU, and an LM head tied to the token embedding."""

    def __init__(self, vocab_size=128, block_size=32, n_layer=2, n_head=4, n_embd=64):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(GPT2Block(n_embd, n_head, block_size) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


@_arch
def build_gpt2(batch=1):
    rng = _seed()
    m = GPT2()
    ids = rng.integers(0, 128, (batch, 24)).astype(np.int64)
    return m, {"input_ids": ids}, {"input_ids": [0], "logits": [0]}


# -- Llama (Touvron et al. 2023) -----------------------------------------------------------------
# (its RMSNorm is in common.py, with the other norm randomize_norms knows)

def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class LlamaAttention(nn.Module):
    """Grouped-query attention: ``n_kv_heads`` key/value heads, each repeated (``repeat_interleave``)
    for ``n_heads // n_kv_heads`` query heads; rotary embeddings on q and k; causal mask."""

    def __init__(self, dim, n_heads, n_kv_heads, max_seq, theta=10000.0):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.n_rep = n_heads // n_kv_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        freqs = torch.outer(torch.arange(max_seq).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, x, mask):
        bsz, seqlen, _ = x.shape
        q = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos_cached[:seqlen], self.sin_cached[:seqlen]
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = torch.repeat_interleave(k, self.n_rep, dim=1)
        v = torch.repeat_interleave(v, self.n_rep, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        scores = F.softmax((scores + mask).float(), dim=-1).type_as(q)
        out = torch.matmul(scores, v).transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(out)


class LlamaFeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, max_seq):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = LlamaAttention(dim, n_heads, n_kv_heads, max_seq)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = LlamaFeedForward(dim, 176)

    def forward(self, x, mask):
        h = x + self.attention(self.attention_norm(x), mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, vocab_size=128, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq=32):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(LlamaBlock(dim, n_heads, n_kv_heads, max_seq) for _ in range(n_layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, tokens):
        seqlen = tokens.shape[1]
        h = self.tok_embeddings(tokens)
        mask = torch.full((seqlen, seqlen), float("-inf"), device=tokens.device)
        mask = torch.triu(mask, diagonal=1)
        for layer in self.layers:
            h = layer(h, mask)
        return self.output(self.norm(h)).float()


@_arch
def build_llama(batch=1):
    rng = _seed()
    m = Llama()
    ids = rng.integers(0, 128, (batch, 20)).astype(np.int64)
    return m, {"tokens": ids}, {"tokens": [0], "logits": [0]}


# -- BERT-style encoder (Devlin et al. 2019; Hugging Face's layout) ------------------------------

class BertSelfAttention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.num_attention_heads, self.attention_head_size = heads, hidden // heads
        self.all_head_size = hidden
        self.query, self.key, self.value = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(new_x_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask):
        q = self.transpose_for_scores(self.query(hidden_states))
        k = self.transpose_for_scores(self.key(hidden_states))
        v = self.transpose_for_scores(self.value(hidden_states))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.attention_head_size)
        probs = nn.functional.softmax(scores + attention_mask, dim=-1)
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return context.view(context.size()[:-2] + (self.all_head_size,))


class BertLayer(nn.Module):
    def __init__(self, hidden, heads, intermediate):
        super().__init__()
        self.attention = BertSelfAttention(hidden, heads)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, intermediate)
        self.output = nn.Linear(intermediate, hidden)
        self.out_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x, mask):
        x = self.attn_norm(self.attn_out(self.attention(x, mask)) + x)
        return self.out_norm(self.output(F.gelu(self.intermediate(x))) + x)


class BertModel(nn.Module):
    """Word, position and token-type embeddings, LayerNorm, post-norm layers with the extended
    attention mask, and the tanh pooler on the first token. Outputs the sequence and the pooled vector."""

    def __init__(self, vocab=128, hidden=64, heads=4, layers=2, max_pos=32, type_vocab=2):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_pos, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        self.register_buffer("position_ids", torch.arange(max_pos).expand((1, -1)), persistent=False)
        self.emb_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layer = nn.ModuleList(BertLayer(hidden, heads, 2 * hidden) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, input_ids, token_type_ids, attention_mask):
        seq_length = input_ids.size(1)
        position_ids = self.position_ids[:, :seq_length]
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = self.emb_norm(x + self.position_embeddings(position_ids))
        ext = attention_mask[:, None, None, :].to(dtype=x.dtype)
        ext = (1.0 - ext) * torch.finfo(x.dtype).min
        for layer in self.layer:
            x = layer(x, ext)
        return x, torch.tanh(self.pooler(x[:, 0]))


@_arch
def build_bert(batch=1):
    rng = _seed()
    m = BertModel()
    seq = 16
    ids = rng.integers(0, 128, (batch, seq)).astype(np.int64)
    types_ = np.zeros((batch, seq), np.int64)
    types_[:, seq // 2:] = 1
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq - 3:] = 0
    return m, {"input_ids": ids, "token_type_ids": types_, "attention_mask": mask}, \
        {"input_ids": [0], "token_type_ids": [0], "attention_mask": [0], "last_hidden_state": [0],
         "pooler_output": [0]}


# -- recurrent sequence models -------------------------------------------------------------------

class LSTMTagger(nn.Module):
    """Two-layer ``nn.LSTM`` (batch_first), a Linear per step, and the last layer's final hidden state."""

    def __init__(self, features=16, hidden=64, classes=8):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x):
        out, (h_n, c_n) = self.lstm(x)
        return self.fc(out), h_n[-1]


class GRUClassifier(nn.Module):
    """Bidirectional ``nn.GRU`` (batch_first) over embedded tokens; both directions' last states."""

    def __init__(self, vocab=64, emb=32, hidden=48, classes=5):
        super().__init__()
        self.embedding = nn.Embedding(vocab, emb)
        self.gru = nn.GRU(emb, hidden, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, tokens):
        out, h_n = self.gru(self.embedding(tokens))
        return self.fc(torch.cat((h_n[0], h_n[1]), dim=1)), out


class RNNRegressor(nn.Module):
    """A plain ``nn.RNN`` (tanh), batch_first, one layer, and a Linear on every step."""

    def __init__(self, features=8, hidden=32):
        super().__init__()
        self.rnn = nn.RNN(features, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, 1)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.fc(out)


@_arch
def build_lstm(batch=1):
    rng = _seed()
    return LSTMTagger(), {"x": rng.standard_normal((batch, 20, 16)).astype(np.float32)}, \
        {"x": [0], "tags": [0], "h_last": [0]}


@_arch
def build_gru(batch=1):
    rng = _seed()
    return GRUClassifier(), {"tokens": rng.integers(0, 64, (batch, 24)).astype(np.int64)}, \
        {"tokens": [0], "logits": [0], "states": [0]}


@_arch
def build_rnn(batch=1):
    rng = _seed()
    return RNNRegressor(), {"x": rng.standard_normal((batch, 16, 8)).astype(np.float32)}, {"x": [0], "y": [0]}


# -- wav2vec2-style audio encoder (Baevski et al. 2020) ------------------------------------------

class Wav2Vec2Encoder(nn.Module):
    """wav2vec 2.0's feature encoder (Conv1d stack: the first conv with GroupNorm over every channel,
    GELU after each), feature projection (LayerNorm, Linear), the grouped positional convolution
    (weight-normed, its extra step dropped, GELU, added) and one post-norm transformer layer."""

    def __init__(self, dim=32, hidden=64, heads=4, pos_kernel=16, pos_groups=4):
        super().__init__()
        specs = [(10, 5), (3, 2), (3, 2), (2, 2)]
        convs = []
        for i, (k, s) in enumerate(specs):
            layer = [nn.Conv1d(1 if i == 0 else dim, dim, k, s, bias=False)]
            if i == 0:
                layer.append(nn.GroupNorm(dim, dim, affine=True))
            layer.append(nn.GELU())
            convs.append(nn.Sequential(*layer))
        self.conv_layers = nn.ModuleList(convs)
        self.layer_norm = nn.LayerNorm(dim)
        self.projection = nn.Linear(dim, hidden)
        conv = nn.Conv1d(hidden, hidden, pos_kernel, padding=pos_kernel // 2, groups=pos_groups)
        self.pos_conv = nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2)
        self.pad_remove = pos_kernel % 2 == 0
        self.enc_norm = nn.LayerNorm(hidden)
        self.attention = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.attn_norm = nn.LayerNorm(hidden)
        self.ff = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))
        self.final_norm = nn.LayerNorm(hidden)

    def forward(self, input_values):
        x = input_values[:, None]
        for conv in self.conv_layers:
            x = conv(x)
        x = self.projection(self.layer_norm(x.transpose(1, 2)))
        pos = self.pos_conv(x.transpose(1, 2))
        if self.pad_remove:
            pos = pos[:, :, :-1]
        x = self.enc_norm(x + F.gelu(pos).transpose(1, 2))
        x = self.attn_norm(x + self.attention(x, x, x, need_weights=False)[0])
        return self.final_norm(x + self.ff(x))


@_arch
def build_wav2vec2(batch=1):
    rng = _seed()
    return Wav2Vec2Encoder(), {"input_values": rng.standard_normal((batch, 1600)).astype(np.float32)}, \
        {"input_values": [0], "last_hidden_state": [0]}
