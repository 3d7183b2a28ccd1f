// Sign in with an API token: everything but /health needs one, reads included, from the first
// start; what a user sees is their own work (all of it for an admin token). A first `pipeboard up`
// prints a sign-in link holding the admin token (main.js takes it from `#token=`); on the server
// machine `pipeboard token create NAME --scope write --user WHO` prints more. The token is kept in
// localStorage and sent as `Authorization: Bearer`; the API asks for it with a 401.

import { getToken, setToken, whoAmI } from '../api.js';
import { h, navigate } from '../util.js';

export function render(container, { next }) {
  const input = h('input', { id: 'token', type: 'password', autocomplete: 'off', required: true, value: getToken() });
  const message = h('p', { role: 'alert', id: 'signin-message', class: 'field-error' });
  const form = h('form', { class: 'panel signin', id: 'signin-form' },
    h('h1', {}, 'Sign in'),
    h('p', { class: 'muted', id: 'signin-why' }, 'This server shows its jobs, models and code only to signed-in users: '
      + 'sign in with your API token. The first ', h('code', {}, 'pipeboard up'),
      ' printed a sign-in link with the admin token; on the server machine an admin runs ',
      h('code', {}, 'pipeboard token create laptop --scope write --user YOU'), ' to make yours.'),
    h('label', { for: 'token' }, 'API token'), input,
    h('div', { class: 'toolbar', style: 'margin-top:0.8rem' }, h('button', { type: 'submit', class: 'primary' }, 'Sign in')),
    message);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    message.textContent = '';
    const token = input.value.trim();
    if (!token) { message.textContent = 'token: paste the token you created'; return; }
    setToken(token);
    try {
      const me = await whoAmI();
      if (me && me.authenticated === false) throw new Error('the server did not accept this token');
      navigate(next && next !== '/signin' ? next : '/jobs');
    } catch (err) {
      setToken('');
      message.textContent = `Not signed in: ${err.message}`;
    }
  });
  container.append(form);
  input.focus();
  return null;
}
